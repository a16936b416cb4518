import Foundation
import UbiqClock

/// Per-operation counts and time spent in the daemon, when `FuseOptions.operationStats` is on
/// (the CLI's UBIQ_OP_STATS=1): written to the log at unmount. For profiling; off by default
/// (one branch per request).
final class OpStats: @unchecked Sendable {
    /// Set once, by `FuseServer.mount`, before any request is taken.
    nonisolated(unsafe) static var enabled = false
    static let shared = OpStats()
    private let lock = NSLock()
    private var table: [String: (count: Int, nanos: UInt64)] = [:]

    @inline(__always)
    static func measure<T>(_ op: String, _ body: () -> T) -> T {
        guard enabled else { return body() }
        let start = SteadyClock.nanoseconds
        let r = body()
        shared.add(op, SteadyClock.nanoseconds - start)
        return r
    }

    private func add(_ op: String, _ nanos: UInt64) {
        lock.lock()
        let cur = table[op] ?? (0, 0)
        table[op] = (cur.count + 1, cur.nanos + nanos)
        lock.unlock()
    }

    func report() -> String {
        lock.lock(); defer { lock.unlock() }
        return table.sorted { $0.value.nanos > $1.value.nanos }.map { op, v in
            String(format: "%@ %d calls, %.1f us avg", op, v.count, Double(v.nanos) / Double(max(1, v.count)) / 1000)
        }.joined(separator: "; ")
    }
}
