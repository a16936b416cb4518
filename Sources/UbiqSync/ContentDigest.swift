import Foundation
import UbiqStore

/// SHA-256 of a file's content, the digest a device writes beside the bytes it uploads
/// (`ObjectMetadata.sha256`) and checks a download against. A value: a copy hashes on its own.
public struct ContentDigest {
    private var hasher = SHA256()
    private var buffer: [UInt8] = []
    static let bufferLimit = 1 << 20

    public init() {}

    /// Adds bytes `range` of the file `fd` (false: the file could not be read, or ended first).
    public mutating func add(_ fd: Int32, _ range: Range<Int64>) -> Bool {
        // As large as the bytes to read, up to 1 MiB: a small file's digest zeroes (and faults
        // in) no more than the file, where a fixed 1 MiB cost more than the file's download.
        let size = Int(min(Int64(Self.bufferLimit), max(range.upperBound - range.lowerBound, 1)))
        if buffer.count < size { buffer = [UInt8](repeating: 0, count: buffer.isEmpty ? size : Self.bufferLimit) }
        if !isKnownUniquelyReferenced(&hasher) { hasher = hasher.copy() }
        var at = range.lowerBound
        while at < range.upperBound {
            let want = Int(min(Int64(buffer.count), range.upperBound - at))
            let n = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, want, off_t(at)) }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { return false }
            buffer.withUnsafeBytes { hasher.update(UnsafeRawBufferPointer(rebasing: $0[..<n])) }
            at += Int64(n)
        }
        return true
    }

    /// The digest, in lowercase hex.
    public func hex() -> String {
        SHA256.hex(hasher.digest())
    }

    /// The digest of the whole file at `path`.
    public static func of(path: String) throws -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        if fd < 0 { throw SyncError.local("cannot read \(path) to digest it: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw SyncError.local("cannot stat \(path): \(String(cString: strerror(errno)))") }
        var d = ContentDigest()
        guard d.add(fd, 0 ..< Int64(st.st_size)) else { throw SyncError.local("cannot read \(path) to digest it") }
        return d.hex()
    }
}
