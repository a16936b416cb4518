import Foundation
import Testing
import TestSupport
import UbiqFS
import UbiqState
import UbiqStore
@testable import UbiqSync

/// Told of a download's end, does what another thread and another device's version can do in
/// that moment: a file opened elsewhere takes the number the download's cache file had, and a
/// cancel comes for the download before it is dropped. Then says whether that file is still open.
final class CancelWhenContentArrives: ContentSink, @unchecked Sendable {
    let forward: any ContentSink
    weak var materializer: Materializer?
    let number: Int32
    let other: String
    private(set) var otherStillOpen: Bool?

    init(forward: any ContentSink, materializer: Materializer, number: Int32, other: String) {
        self.forward = forward
        self.materializer = materializer
        self.number = number
        self.other = other
    }

    func contentArrived(_ ino: UInt64, version: String) {
        let fd = open(other, O_RDONLY | O_CLOEXEC)
        if fd >= 0 && fd != number {
            dup2(fd, number)
            close(fd)
        }
        materializer?.cancel(ino)
        otherStillOpen = fcntl(number, F_GETFD) != -1
        if otherStillOpen == true { close(number) }
        forward.contentArrived(ino, version: version)
    }

    func contentRejected(_ ino: UInt64) { forward.contentRejected(ino) }
}

@Suite struct MaterializerCloseTests {
    /// A download's cache file is closed once: its end closed it, and a cancel before the job was
    /// dropped (another device's version) closed the same number again, which by then was
    /// another thread's file (a store blob being copied failed with EBADF in a clean-clone run).
    @Test func aDownloadsFileIsClosedOnce() throws {
        let store = try newStore()
        let a = try Device(store: store)
        let b = try Device(store: store, completeInBackground: false)
        // 24 chunks: the first read and its readahead leave most of them to fetch.
        try a.write("f", String(repeating: (0 ..< 100_000).map { String(format: "%09d\n", $0) }.joined(), count: 24))
        a.sync()
        b.pull()
        let ino = try b.ino("f")
        let fh = try b.fs.open(ino, flags: O_RDONLY)
        defer { b.fs.release(fh) }
        var buf = [UInt8](repeating: 0, count: 1 << 20)
        func read(_ offset: Int) throws -> Int {
            try buf.withUnsafeMutableBytes { try b.fs.read(fh, offset: Int64(offset), count: 1 << 20, into: $0.baseAddress!) }
        }
        _ = try read(0)
        try #require(b.materializer.localBytes(ino) != nil, "the download goes on")
        // The download's cache file, open while it goes on.
        let cacheFile = b.dir.path + "/cache/\(ino)"
        let number = try #require((try FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")).compactMap { Int32($0) }
            .first { (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\($0)")) == cacheFile })
        let other = b.dir.path + "/other"
        FileManager.default.createFile(atPath: other, contents: Data("other".utf8))
        let sink = CancelWhenContentArrives(forward: b.fs, materializer: b.materializer, number: number, other: other)
        b.materializer.attach(sink: sink)
        var at = 0
        while true {
            let n = try read(at)
            if n == 0 { break }
            at += n
        }
        // The sink is told on the download's own thread, after the reads were answered.
        _ = waitUntil(seconds: 20) { sink.otherStillOpen != nil }
        #expect(sink.otherStillOpen == true, "the number the download's file had was closed again")
    }
}
