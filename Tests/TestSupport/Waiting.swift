import Foundation

/// Waits until `ok` holds, looking again every `every` seconds, for at most `seconds` of wall
/// time (a guard against a hang, not a timing assertion). Returns whether `ok` holds at the end;
/// a test that needs it says so with `#expect(waitUntil { … })`.
@discardableResult
public func waitUntil(seconds: Double = 30, every: Double = 0.001, _ ok: () throws -> Bool) rethrows -> Bool {
    let deadline = Date(timeIntervalSinceNow: seconds)
    while try !ok() {
        if Date() >= deadline { return false }
        usleep(useconds_t(every * 1_000_000))
    }
    return true
}

/// Runs `body` on a thread of its own and waits for it without holding a thread of Swift's
/// cooperative pool (two, on two cores). A test whose body blocks on S3 work (`runBlocking`, a
/// `Device` over an S3 store) runs so: AsyncHTTPClient streams a request's body from a task on
/// that pool, so two such bodies blocking its two threads at once deadlocked the test process.
public func onAThreadOfItsOwn<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { done in
        let thread = Thread { done.resume(with: Result { try body() }) }
        thread.stackSize = 8 << 20
        thread.start()
    }
}
