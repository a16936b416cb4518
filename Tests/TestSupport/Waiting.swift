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
