import Foundation
import UbiqClock

/// A thread that runs rounds of work until stopped, and between two rounds waits as the round
/// asks: until a kick, a stop or a deadline. The Uploader's and the ChangeFeed's loop.
///
/// Its waits go by `time` (the state's clock: a test's `ManualTime` decides when a pause is over).
///
/// Its owner may guard more of its own state with `cond` (the Uploader's `hurryAndWait` waits
/// on it); `running`, `kicked` and `idle` are read and written only with `cond` held.
final class BackgroundLoop: @unchecked Sendable {
    let cond = NSCondition()
    let time: any TimeSource
    /// Started and not stopped.
    private(set) var running = false
    private var stopped = true
    /// A kick came since the loop last finished waiting.
    private(set) var kicked = false
    /// The loop waits with nothing to do.
    private(set) var idle = false

    init(time: any TimeSource = SystemTime()) { self.time = time }

    /// What a round asks for before the next: wait up to `upTo` seconds unless kicked (no kick
    /// came already), then, if kicked, `atLeast` seconds more (a burst of kicks is taken in one
    /// round instead of one round each).
    struct Pause {
        var upTo: TimeInterval
        var atLeast: TimeInterval = 0
        /// The next round at once.
        static let none = Pause(upTo: 0)
    }

    /// Whether the loop waits with nothing to do now (a test that moves its clock waits for this).
    var isIdle: Bool { cond.lock(); defer { cond.unlock() }; return idle }

    /// Whether `stop` was called and the thread has not yet ended (a long round asks, to end early).
    var isStopping: Bool { cond.lock(); defer { cond.unlock() }; return !running && !stopped }

    /// Starts a thread named `name` that runs `round` until `stop`.
    func start(name: String, _ round: @escaping @Sendable () -> Pause) {
        cond.lock()
        defer { cond.unlock() }
        guard !running else { return }
        running = true
        stopped = false
        let t = Thread { [self] in loop(round) }
        t.name = name
        t.start()
    }

    /// Stops the thread, after the round in progress, and waits for it.
    func stop() {
        cond.lock()
        running = false
        cond.broadcast()
        while !stopped { cond.wait() }
        cond.unlock()
    }

    /// Notes a kick; wakes the loop when it waits with nothing to do, or always when `wake`
    /// (a broadcast: everything else waiting on `cond` wakes too). Call with `cond` held.
    func kickLocked(wake: Bool) {
        kicked = true
        if wake || idle { cond.broadcast() }
    }

    private func loop(_ round: @Sendable () -> Pause) {
        while true {
            cond.lock()
            if !running { stopped = true; cond.broadcast(); cond.unlock(); return }
            cond.unlock()
            let pause = round()
            cond.lock()
            if running && !kicked && pause.upTo > 0 {
                idle = true
                let deadline = time.now + pause.upTo
                while running && !kicked && time.wait(cond, until: deadline) {}
                idle = false
            }
            if running && kicked && pause.atLeast > 0 { _ = time.wait(cond, until: time.now + pause.atLeast) }
            kicked = false
            cond.unlock()
        }
    }
}
