import Foundation

/// What devices write in the bucket for each other to take on their word (log objects and
/// snapshot parts: what each object holds, its metadata above all, without a HEAD) is sealed
/// with a key made from the bucket's secret access key: an HMAC-SHA-256 of the object's name
/// and bytes, in a last line `{"op":"seal","mac":"…"}`. A reader takes an object's claims only
/// when its seal holds; the entries of one that is not sealed (another tool's, a forger's
/// without the key, an older client's) are hints only: each key they name is asked of the
/// bucket (a HEAD, or a listing where many are), so a forged snapshot or log entry costs
/// requests, never a wrong file (docs/security.md). The name is sealed too, so a sealed part
/// cannot be passed off as another snapshot's.
///
/// Devices that reach the bucket with different secret keys cannot check each other's seals:
/// each then asks the bucket for what the other wrote, as for another tool's objects.
public struct BucketSeal: Sendable {
    let key: [UInt8]

    /// The seal of the bucket and prefix reached with `secret`.
    public init(secret: String, bucket: String, prefix: String) {
        key = SHA256.hmac(key: Array(secret.utf8), Array("ubiq seal v1 \(bucket)/\(prefix)".utf8))
    }

    /// A seal of a key given (tests).
    init(key: [UInt8]) { self.key = key }

    static let opening = Data(#"{"op":"seal","mac":""#.utf8)

    private func mac(_ body: some Collection<UInt8>, name: String) -> String {
        SHA256.hex(SHA256.hmac(key: key, Array(name.utf8) + [0x0A] + Array(body)))
    }

    /// `body` (whole lines) with its seal as `name`'s.
    public func sealed(_ body: Data, name: String) -> Data {
        var out = body
        if let last = out.last, last != 0x0A { out.append(0x0A) }
        let covered = out
        out.append(Self.opening)
        out.append(Data(mac(covered, name: name).utf8))
        out.append(Data("\"}\n".utf8))
        return out
    }

    /// What `data`, read as `name`, holds before its seal line, and whether that seal holds
    /// (false: no seal, another key's, or bytes changed; the whole of `data` comes back then).
    public func opened(_ data: Data, name: String) -> (body: Data, sealed: Bool) {
        var end = data.endIndex
        while end > data.startIndex, data[end - 1] == 0x0A { end -= 1 }
        let lineStart = data[..<end].lastIndex(of: 0x0A).map { $0 + 1 } ?? data.startIndex
        let line = data[lineStart ..< end]
        guard line.starts(with: Self.opening), line.count == Self.opening.count + 64 + 2 else { return (data, false) }
        let given = String(decoding: line.dropFirst(Self.opening.count).prefix(64), as: UTF8.self)
        let body = data[data.startIndex ..< lineStart]
        // Compared in full, whatever differs first.
        let want = Array(mac(body, name: name).utf8), got = Array(given.utf8)
        let same = zip(want, got).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0 && want.count == got.count
        return same ? (Data(body), true) : (data, false)
    }
}
