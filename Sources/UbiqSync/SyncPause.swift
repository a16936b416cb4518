import Foundation
import Synchronization
import UbiqState

/// Sync paused by the user (`ubiq pause`, as OneDrive's "Pause syncing" and a metered
/// connection ask): this device's changes wait to upload and other devices' changes wait to
/// come in; what is opened is still downloaded (a placeholder is read from the store, as
/// ever). Kept in the state database, so a restart stays paused, until `ubiq resume` or,
/// for a pause of a given length, until that time has come by the state's clock.
public final class SyncPause: Sendable {
    static let metaKey = "sync_paused_until"
    private let state: LocalState
    /// Until when (`distantFuture`: until resumed); nil: not paused.
    private let until: Mutex<Date?>

    public init(state: LocalState) throws {
        self.state = state
        let saved = try state.read { try $0.meta(Self.metaKey) }
        until = Mutex(saved.flatMap(Self.date))
    }

    static func date(_ text: String) -> Date? {
        text == "resume" ? .distantFuture : Double(text).map { Date(timeIntervalSince1970: $0) }
    }

    /// Until when sync is paused (`distantFuture`: until `resume`); nil: it is not.
    public var pausedUntil: Date? {
        guard let u = until.withLock({ $0 }) else { return nil }
        return u > state.time.now ? u : nil
    }

    public var isPaused: Bool { pausedUntil != nil }

    /// Seconds until the pause is over by the clock (nil: not paused; `.infinity`: until resumed).
    public var secondsLeft: TimeInterval? {
        guard let u = pausedUntil else { return nil }
        return u == .distantFuture ? .infinity : u.timeIntervalSince(state.time.now)
    }

    /// Pauses for `seconds` (nil: until `resume`).
    public func pause(for seconds: TimeInterval?) throws {
        let u = seconds.map { state.time.now.addingTimeInterval($0) } ?? .distantFuture
        try state.write { tx in try tx.setMeta(Self.metaKey, u == .distantFuture ? "resume" : String(u.timeIntervalSince1970)) }
        until.withLock { $0 = u }
    }

    /// What `user.ubiq.sync-paused` says: empty (not paused), `indefinitely` (until
    /// `ubiq resume`), or the time it ends (UTC, ISO 8601).
    public var attribute: String {
        guard let u = pausedUntil else { return "" }
        return u == .distantFuture ? "indefinitely" : ISO8601DateFormatter().string(from: u)
    }

    /// How a refusal says it: "until ubiq resume", "until TIME".
    public var said: String {
        let a = attribute
        return a == "indefinitely" ? "until ubiq resume" : "until \(a)"
    }

    public func resume() throws {
        try state.write { tx in try tx.setMeta(Self.metaKey, "") }
        until.withLock { $0 = nil }
    }
}
