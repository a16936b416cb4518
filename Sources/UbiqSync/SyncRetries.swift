import Foundation
import UbiqClock

/// How the sync engine tries again what failed: each of its retry policies (`RetryPolicy`), in
/// one place. (The S3 store's own request retries are `S3Client.retries`.)
public enum SyncRetries {
    /// A store call the change feed makes within a poll (its cursor, a page of changes, a
    /// HEAD) that failed transiently: two more tries, soon.
    public static let storeCall = RetryPolicy(first: 0.05, tries: 3)
    /// A look at the store `ubiq sync` asked for: twice more, 0.2 s and 0.4 s later.
    public static let syncAsked = RetryPolicy(first: 0.2, tries: 3)
    /// The importer's listing of the whole store: three more tries.
    public static let listing = RetryPolicy(first: 0.2, tries: 4)
    /// A chunk of a download (`tries`: `Materializer.attempts`), up to 3.2 s apart.
    public static func chunk(tries: Int) -> RetryPolicy { RetryPolicy(first: 0.2, most: 3.2, tries: tries) }
    /// An upload that failed: from half a second up to a minute apart, for as long as it takes.
    public static let upload = RetryPolicy(first: 0.5, most: 60)
    /// An upload the store sent back (it refused what it had just said it holds): ten tries
    /// half a second apart, then backing off as a failure does.
    public static let sentBack = RetryPolicy(first: 0.5, most: 60, steady: 10)
    /// The change feed's next poll after polls that failed (the store is down): the poll
    /// interval doubled each time, up to 32 of them or a minute.
    public static func feed(interval: TimeInterval) -> RetryPolicy {
        RetryPolicy(first: 2 * interval, most: min(60, 32 * interval))
    }
}
