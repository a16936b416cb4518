import Foundation
import Synchronization
import CUbiq
import UbiqClock

/// Gives the memory that large passing work freed back to the system.
///
/// A mount's import, a listing of a bucket, a batch of remote changes and a snapshot allocate a
/// record or two per item and free them when done. glibc keeps what is freed for the next
/// allocation, in the arena of the thread that freed it, and returns to the system only what
/// lies at the top of a heap: a mount of 20,000 files kept 55 MiB of its own (anonymous)
/// memory, of which 16 MiB were in use (`malloc_trim` gave back the rest). So the daemon looks
/// every few seconds (`start`) and asks glibc to give the free pages back when its resident
/// memory grew by `growth` since the last time it did; and once when the mount is ready (`now`).
public final class HeapRelease: @unchecked Sendable {
    /// Resident bytes after the last release (or the least seen since).
    private let last = Mutex<Int64>(0)
    /// What the resident memory must grow by before a release is tried.
    public let growth: Int64
    /// Seconds between two looks (`start`).
    public let interval: TimeInterval
    /// Its looks (`start`), under `timerLock`.
    private var timer: (any DispatchSourceTimer)?
    private let timerLock = NSLock()
    private let report: @Sendable (_ before: Int64, _ after: Int64, _ seconds: Double) -> Void

    public init(growth: Int64 = 8 << 20, interval: TimeInterval = 5,
                report: @escaping @Sendable (_ before: Int64, _ after: Int64, _ seconds: Double) -> Void = { _, _, _ in }) {
        self.growth = growth
        self.interval = interval
        self.report = report
    }

    /// Looks every `interval` seconds, on a background queue, until `stop`.
    public func start() {
        let t = DispatchSource.makeTimerSource(queue: .global(qos: .utility))
        t.schedule(deadline: .now() + interval, repeating: interval, leeway: .seconds(1))
        t.setEventHandler { [weak self] in self?.ifGrown() }
        timerLock.withLock { timer?.cancel(); timer = t }
        t.resume()
    }

    public func stop() { timerLock.withLock { timer?.cancel(); timer = nil } }

    /// Releases the free pages if the resident memory grew by `growth` since the last release.
    /// Returns whether it released.
    @discardableResult
    public func ifGrown() -> Bool {
        guard let resident = Self.residentBytes() else { return false }
        let due = last.withLock { least -> Bool in
            if least == 0 || resident < least { least = resident }
            return resident - least >= growth
        }
        return due ? now() : false
    }

    /// Releases the free pages now (the mount is ready: its import is over). Returns whether
    /// any went back.
    @discardableResult
    public func now() -> Bool {
        let before = Self.residentBytes() ?? 0
        let start = SteadyClock.nanoseconds
        let released = cubiq_release_free_memory() != 0
        let seconds = Double(SteadyClock.nanoseconds - start) / 1e9
        let after = Self.residentBytes() ?? before
        last.withLock { $0 = after }
        if released { report(before, after, seconds) }
        return released
    }

    /// This process's resident memory (`/proc/self/statm`), in bytes.
    public static func residentBytes() -> Int64? {
        guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return nil }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Int64(fields[1]) else { return nil }
        return pages * Int64(sysconf(Int32(_SC_PAGESIZE)))
    }
}
