import Foundation
import Logging
import UbiqState
import UbiqStore

public enum SyncError: Error, CustomStringConvertible {
    case noRemoteCopy(ino: UInt64)
    case sizeMismatch(key: String, expected: Int64, got: Int64)
    case local(String)

    public var description: String {
        switch self {
        case .noRemoteCopy(let ino): return "inode \(ino) has no copy in the store"
        case let .sizeMismatch(key, e, g): return "\(key): store sent \(g) bytes, expected \(e)"
        case .local(let s): return s
        }
    }
}

/// Brings a placeholder's bytes from the store into the content cache.
///
/// The whole version is fetched into a temporary file and installed by
/// rename, pinned to the version the placeholder stands for, so a file is
/// never a mix of two versions. The caller holds the Coordinator claim.
public final class Materializer: Sendable {
    let store: any CloudStore
    let state: LocalState
    let cache: ContentCache
    let logger: Logger
    /// Bytes per ranged read.
    public let chunkSize: Int64

    public init(store: any CloudStore, state: LocalState, cache: ContentCache, logger: Logger,
                chunkSize: Int64 = 8 << 20) {
        self.store = store; self.state = state; self.cache = cache; self.logger = logger
        self.chunkSize = chunkSize
    }

    /// Downloads the content of `ino` into the cache.
    public func fetch(_ ino: UInt64) throws {
        let (entry, rec) = try state.read { tx -> (EntryRecord?, InodeRecord?) in
            (try tx.entries(of: ino).first { $0.remoteKey != nil }, try tx.inode(ino))
        }
        guard let entry, let key = entry.remoteKey, let version = entry.remoteVersion, let rec else {
            throw SyncError.noRemoteCopy(ino: ino)
        }
        let tmp = cache.temporaryPath(for: ino)
        let fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        if fd < 0 { throw SyncError.local("cannot create \(tmp): \(String(cString: strerror(errno)))") }
        var ok = false
        defer {
            close(fd)
            if !ok { unlink(tmp) }
        }
        var offset: Int64 = 0
        let store = self.store
        while offset < rec.size {
            let range = offset ..< min(rec.size, offset + chunkSize)
            let data = try runBlocking { try await store.read(key, version: version, range: range) }
            if data.isEmpty { break }
            let written = data.withUnsafeBytes { buf -> Int in
                var done = 0
                while done < buf.count {
                    let n = pwrite(fd, buf.baseAddress! + done, buf.count - done, off_t(offset) + off_t(done))
                    if n < 0 { if errno == EINTR { continue }; return -Int(errno) }
                    done += n
                }
                return done
            }
            if written < 0 { throw SyncError.local("writing cache: \(String(cString: strerror(Int32(-written))))") }
            offset += Int64(data.count)
        }
        if offset != rec.size { throw SyncError.sizeMismatch(key: key, expected: rec.size, got: offset) }
        if Glibc.fsync(fd) != 0 { throw SyncError.local("fsync cache: \(String(cString: strerror(errno)))") }
        try cache.install(tmp, as: ino)
        ok = true
        logger.debug("downloaded \(key)@\(version): \(offset) bytes")
    }
}
