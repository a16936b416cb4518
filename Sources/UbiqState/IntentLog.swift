import Foundation

/// The changes recorded (`LocalState.record`) and not yet in the database, in a file beside it
/// (`state.db-intents`), one write(2) a request. What a write returned for is in the kernel's
/// page cache and survives a killed daemon as the database's WAL does; the next open applies
/// what the database does not have yet (`LocalState.recover`).
///
/// A record: the length of its body (u32), the body's CRC-32 (u32), the body: its sequence
/// number (u64), the number of changes (u32), the changes (`StateChange.encode`). Reading stops
/// at the first record that is cut short or fails its check (a power loss mid-write).
final class IntentLog: @unchecked Sendable {
    let path: String
    /// The file and its size (used and changed only under `LocalState`'s pending lock).
    private var fd: Int32
    private(set) var size: Int64

    init(path: String) throws {
        self.path = path
        fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StateError.database("cannot open \(path): \(String(cString: strerror(errno)))") }
        var st = stat()
        size = fstat(fd, &st) == 0 ? Int64(st.st_size) : 0
    }

    deinit { close(fd) }

    static func record(seq: UInt64, changes: [StateChange]) -> [UInt8] {
        var body = ByteWriter()
        body.u64(seq)
        body.u32(UInt32(changes.count))
        for c in changes { c.encode(to: &body) }
        var out = ByteWriter()
        out.u32(UInt32(body.out.count))
        out.u32(CRC32.of(body.out))
        out.out += body.out
        return out.out
    }

    /// Appends one record; on failure the file is as it was (a record cut short by a full disk
    /// is cut off, so the next ones are not lost behind it). Returns errno on failure.
    func append(_ bytes: [UInt8]) -> Int32? {
        let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if n == bytes.count { size += Int64(n); return nil }
        let err = n < 0 ? errno : ENOSPC
        if n > 0 { _ = ftruncate(fd, off_t(size)) }
        return err
    }

    /// Every whole record, in order.
    func readAll() -> [(seq: UInt64, changes: [StateChange])] {
        guard let data = FileManager.default.contents(atPath: path) else { return [] }
        let bytes = [UInt8](data)
        var out: [(UInt64, [StateChange])] = []
        var r = ByteReader(bytes)
        while true {
            guard let length = try? r.u32(), let sum = try? r.u32(), bytes.count - r.at >= Int(length) else { break }
            let body = [UInt8](bytes[r.at ..< r.at + Int(length)])
            r.at += Int(length)
            guard CRC32.of(body) == sum else { break }
            var b = ByteReader(body)
            guard let seq = try? b.u64(), let count = try? b.u32() else { break }
            var changes: [StateChange] = []
            for _ in 0 ..< count {
                guard let c = try? StateChange.decode(from: &b) else { break }
                changes.append(c)
            }
            guard changes.count == count else { break }
            out.append((seq, changes))
        }
        return out
    }

    /// Empties the file (everything in it is in the database).
    func truncate() {
        if ftruncate(fd, 0) == 0 { size = 0 }
    }

    /// Puts a file holding only `records` in this one's place (what is not in the database yet,
    /// when the rest is): so the log does not grow through a burst that never leaves it empty.
    /// On failure the file stays as it is (it holds those records too).
    func rewrite(_ records: [(seq: UInt64, changes: [StateChange])]) {
        let bytes = records.flatMap { Self.record(seq: $0.seq, changes: $0.changes) }
        let tmp = path + ".new"
        let out = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0o600)
        guard out >= 0 else { return }
        let n = bytes.withUnsafeBytes { write(out, $0.baseAddress, $0.count) }
        guard n == bytes.count, rename(tmp, path) == 0 else { close(out); unlink(tmp); return }
        close(fd)
        fd = out
        size = Int64(bytes.count)
    }

    func sync() { _ = fdatasync(fd) }
}

/// CRC-32 (IEEE), for the intent log's records.
enum CRC32 {
    private static let table: [UInt32] = (0 ..< 256).map { i -> UInt32 in
        var c = UInt32(i)
        for _ in 0 ..< 8 { c = (c & 1) != 0 ? 0xEDB8_8320 ^ (c >> 1) : c >> 1 }
        return c
    }

    static func of(_ bytes: [UInt8]) -> UInt32 {
        var c: UInt32 = 0xFFFF_FFFF
        for b in bytes { c = table[Int((c ^ UInt32(b)) & 0xFF)] ^ (c >> 8) }
        return c ^ 0xFFFF_FFFF
    }
}
