import Foundation

/// One at a time, among async callers, without a task of its own: a caller waits suspended
/// (holding no thread) until the one before it leaves. Store work runs on the store's executor
/// while threads block on it (`runBlocking`); a task started on Swift's cooperative pool to
/// serialize it would wait for a thread that a blocked caller may hold.
final class AsyncGate: @unchecked Sendable {
    private let lock = NSLock()
    private var busy = false
    private var waiting: [CheckedContinuation<Void, Never>] = []

    func run<T>(_ body: () async throws -> T) async rethrows -> T {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let go = lock.withLock { () -> Bool in
                if busy { waiting.append(c); return false }
                busy = true
                return true
            }
            if go { c.resume() }
        }
        defer {
            let next = lock.withLock { () -> CheckedContinuation<Void, Never>? in
                if waiting.isEmpty { busy = false; return nil }
                return waiting.removeFirst()  // handed on: still busy
            }
            next?.resume()
        }
        return try await body()
    }
}

/// A yes or no said once, from synchronous code (a listing's callback), and awaited: the
/// first `say` is the answer, later ones are ignored.
final class AsyncAnswer: @unchecked Sendable {
    private let lock = NSLock()
    private var answer: Bool?
    private var waiter: CheckedContinuation<Bool, Never>?

    func say(_ value: Bool) {
        let w = lock.withLock { () -> CheckedContinuation<Bool, Never>? in
            guard answer == nil else { return nil }
            answer = value
            defer { waiter = nil }
            return waiter
        }
        w?.resume(returning: value)
    }

    var value: Bool {
        get async {
            await withCheckedContinuation { c in
                let now = lock.withLock { () -> Bool? in
                    if let answer { return answer }
                    waiter = c
                    return nil
                }
                if let now { c.resume(returning: now) }
            }
        }
    }
}
