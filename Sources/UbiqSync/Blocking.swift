import Foundation
import UbiqClock
import UbiqStore

/// A value handed between a thread that waits and the task or callback that fills or uses it
/// while it waits (one at a time, so unchecked).
public final class UncheckedBox<T>: @unchecked Sendable {
    public var value: T
    public init(_ value: T) { self.value = value }
}

/// Runs store work off Swift's cooperative pool. A thread that blocks on
/// store work (a libfuse thread, the uploader, a test) must not wait for a
/// job that needs a cooperative thread: with two cores there are two, and
/// two blocked callers would deadlock the process.
final class StoreExecutor: TaskExecutor, @unchecked Sendable {
    static let shared = StoreExecutor()
    private let queue = DispatchQueue(label: "ubiq.store", attributes: .concurrent)

    func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        queue.async { unowned.runSynchronously(on: executor) }
    }
}

/// Runs async store work from a thread that may block (a libfuse thread or
/// the uploader's thread) and waits for its result.
public func runBlocking<T>(_ op: @escaping @Sendable () async throws -> T) throws -> T {
    try waitForAnswer { answer in
        Task(executorPreference: StoreExecutor.shared) {
            do { answer(.success(try await op())) } catch { answer(.failure(error)) }
        }
    }
}

/// `runBlocking`, with the work cancelled once `stopping` says so (asked every 50 ms): work that
/// looks for cancellation (a listing of the whole bucket, between its requests) ends early with
/// `CancellationError`, and an unmount does not wait for it.
public func runBlocking<T>(stopping: () -> Bool, _ op: @escaping @Sendable () async throws -> T) throws -> T {
    let box = UncheckedBox<Result<T, Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    let task = Task(executorPreference: StoreExecutor.shared) {
        do { box.value = .success(try await op()) } catch { box.value = .failure(error) }
        done.signal()
    }
    var cancelled = false
    while done.wait(timeout: .now() + 0.05) == .timedOut {
        if !cancelled && stopping() {
            task.cancel()
            cancelled = true
        }
    }
    return try box.value!.get()
}

/// Starts work that answers through a callback (on this thread or any other, once) and waits
/// on this thread for the answer. The callback only signals, so it may be called under a lock.
public func waitForAnswer<T>(_ start: (@escaping @Sendable (Result<T, Error>) -> Void) -> Void) throws -> T {
    let box = UncheckedBox<Result<T, Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    start { r in
        box.value = r
        done.signal()
    }
    done.wait()
    return try box.value!.get()
}

/// `body`, tried again as `policy` says while the store fails transiently.
public func retryingTransient<T>(_ policy: RetryPolicy = SyncRetries.storeCall, _ body: () throws -> T) throws -> T {
    try policy.run(again: { ($0 as? StoreError)?.isTransient == true }, body)
}
