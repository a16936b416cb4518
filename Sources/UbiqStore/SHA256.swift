import CUbiq

/// SHA-256 from the system's libcrypto (OpenSSL: Debian's libssl3 at run time). The content
/// digests a device writes beside what it uploads, and S3's request signatures, are made with it.
public final class SHA256: @unchecked Sendable {
    private let ctx: UnsafeMutableRawPointer

    public init() {
        guard let ctx = cubiq_sha256_new() else { fatalError("libcrypto: out of memory for a SHA-256 context") }
        self.ctx = ctx
    }

    private init(copying other: SHA256) {
        guard let ctx = cubiq_sha256_copy(other.ctx) else { fatalError("libcrypto: out of memory for a SHA-256 context") }
        self.ctx = ctx
    }

    /// Another hasher that has seen the same bytes as this one.
    public func copy() -> SHA256 { SHA256(copying: self) }

    deinit { cubiq_sha256_free(ctx) }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        guard cubiq_sha256_update(ctx, base, bytes.count) == 1 else { fatalError("libcrypto: SHA-256 update failed") }
    }

    public func update(_ bytes: some Sequence<UInt8>) {
        if bytes.withContiguousStorageIfAvailable({ update(UnsafeRawBufferPointer($0)) }) == nil {
            Array(bytes).withUnsafeBytes { update($0) }
        }
    }

    /// The digest of the bytes so far (more may still be added afterwards).
    public func digest() -> [UInt8] {
        guard let copy = cubiq_sha256_copy(ctx) else { fatalError("libcrypto: out of memory for a SHA-256 context") }
        defer { cubiq_sha256_free(copy) }
        var out = [UInt8](repeating: 0, count: 32)
        guard out.withUnsafeMutableBufferPointer({ cubiq_sha256_final(copy, $0.baseAddress) }) == 1 else {
            fatalError("libcrypto: SHA-256 final failed")
        }
        return out
    }

    public static func hash(_ bytes: some Sequence<UInt8>) -> [UInt8] {
        let h = SHA256()
        h.update(bytes)
        return h.digest()
    }

    /// HMAC-SHA-256 of `data` under `key`.
    public static func hmac(key: [UInt8], _ data: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        let ok = key.withUnsafeBytes { k in
            data.withUnsafeBytes { d in
                out.withUnsafeMutableBufferPointer { cubiq_hmac_sha256(k.baseAddress, k.count, d.baseAddress, d.count, $0.baseAddress) }
            }
        }
        guard ok == 1 else { fatalError("libcrypto: HMAC-SHA-256 failed") }
        return out
    }

    /// Bytes in lowercase hex.
    public static func hex(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(64)
        for b in bytes { out.append(digits[Int(b >> 4)]); out.append(digits[Int(b & 15)]) }
        return String(decoding: out, as: UTF8.self)
    }
}
