import Foundation

/// Files and folders the tests make under the temporary directory, removed when the test
/// process exits (the tests make hundreds). Shared by the test targets (TestSupport).
public enum TempPaths {
    private static let lock = NSLock()
    nonisolated(unsafe) private static var made: [URL] = []

    /// A new path under the temporary directory, named `prefix-UUID`; nothing is made there.
    public static func make(_ prefix: String) -> URL {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("\(prefix)-\(UUID().uuidString)")
        lock.lock()
        defer { lock.unlock() }
        if made.isEmpty { atexit { TempPaths.removeAll() } }
        made.append(url)
        return url
    }

    private static func removeAll() {
        lock.lock()
        defer { lock.unlock() }
        // A database's journal files beside it go too.
        for url in made {
            for suffix in ["", "-wal", "-shm", "-journal"] { try? FileManager.default.removeItem(atPath: url.path + suffix) }
        }
        made.removeAll()
    }
}
