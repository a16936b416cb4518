import Foundation

/// An item's sync state in one word: what `user.ubiq.status`, `ubiq status` and `ubiq query`
/// say. The cases are in order of urgency, least first: a folder shows the most urgent word
/// of what is under it, and the rules below are tried most urgent first.
public enum SyncStatus: String, CaseIterable, Comparable, Codable, Sendable {
    /// Here and in the store, the same.
    case current
    /// In the store; its bytes are not here (files only).
    case placeholder
    /// Here only: not in the store yet, or kept on this device by design (the error says why).
    case local
    /// Its bytes are on their way here.
    case downloading
    /// A change here waits to go up, or is going up.
    case uploading
    /// The last upload or download failed; `uploading-error` / `downloading-error` say why.
    case error
    /// Another device changed it too: a conflict copy sits beside it, or its upload met one.
    case conflict

    public static func < (a: SyncStatus, b: SyncStatus) -> Bool {
        allCases.firstIndex(of: a)! < allCases.firstIndex(of: b)!
    }

    /// What is known of an item, from which its word follows (`of(_:)`).
    public struct Facts: Sendable {
        public var conflict = false
        public var queued = false
        /// Kept on this device only by design.
        public var localOnly = false
        public var uploadFailed = false
        public var downloadFailed = false
        public var downloading = false
        public var inStore = true
        public var isRoot = false
        /// A regular file whose bytes are not here.
        public var placeholder = false
        public init() {}
    }

    /// One rule: the word, when it holds (tried in order), and the same test in SQL over the
    /// query's `i` (inodes) and `e` (entries) rows, where the database can tell (nil: it cannot,
    /// and the caller completes the answer from memory).
    struct Rule: Sendable {
        let status: SyncStatus
        let sql: String?
        let holds: @Sendable (Facts) -> Bool
    }

    static let rules: [Rule] = [
        Rule(status: .conflict, sql: "i.upload_conflict = 1") { $0.conflict },
        // A queued item whose upload failed waits to be tried again (the store is down, or
        // full): it is uploading, and `uploading-error` says why it waits.
        Rule(status: .uploading, sql: "EXISTS (SELECT 1 FROM outbox o WHERE o.ino = e.ino)") { $0.queued },
        Rule(status: .local, sql: "i.upload_conflict = 2") { $0.localOnly && !$0.downloadFailed },
        Rule(status: .error, sql: "i.upload_error IS NOT NULL") { $0.uploadFailed || $0.downloadFailed },
        Rule(status: .downloading, sql: nil) { $0.downloading },
        Rule(status: .local, sql: "e.remote_key IS NULL") { !$0.inStore && !$0.isRoot },
        Rule(status: .placeholder, sql: "i.type = \(S_IFREG) AND i.present = 0") { $0.placeholder },
    ]

    /// The word for what is known of an item: the first rule that holds, else current.
    public static func of(_ facts: Facts) -> SyncStatus {
        rules.first { $0.holds(facts) }?.status ?? .current
    }

    /// The same rules as one SQL `CASE` expression over `i` (inodes) and `e` (entries), for the
    /// rules the database can tell; `ubiq query` completes the rest from memory.
    public static var sqlCase: String {
        "CASE " + rules.compactMap { r in r.sql.map { "WHEN \($0) THEN '\(r.status.rawValue)'" } }.joined(separator: " ")
            + " ELSE '\(SyncStatus.current.rawValue)' END"
    }
}
