import Foundation
import Logging

/// A kind of store a device can mount: how its URL reads, what a device's state is bound to,
/// and how it is opened. Each backend is one type beside its store (`DirectoryBackend` here,
/// `S3Backend` in UbiqS3); the command line chooses among them in one place (`ubiq`'s
/// `storeBackends`) and asks nothing of a store that this does not say.
public protocol StoreBackend: Sendable {
    /// The store `url` names, when it is this backend's (nil: another's). Throws a
    /// `StoreURLError` (one line for the user) when it is this backend's and wrong.
    static func parse(_ url: String, _ options: StoreURLOptions) throws -> Self?
    /// The URL in full (`dir:/abs/path`, `s3://bucket/prefix`): what the daemon is given, and
    /// what `ubiq status` and the log say.
    var url: String { get }
    /// What a device's state is bound to (its meta `store_address`): the same for the same
    /// store however it is reached (a bucket and prefix whatever the endpoint is called; the
    /// embedded store by its kind only, as it may move: its `identity` tells it from another).
    var address: String { get }
    /// The local folder the store is, when it is one: not inside the mount point, made only
    /// when asked (`--create-store`), and the one store that takes a quota of ubiq's.
    var folder: String? { get }
    /// Uploads at once unless told (a request to S3 waits a round trip, one to the embedded
    /// store mostly the disk).
    var transfers: Int { get }
    /// Downloads: bytes a request and requests at once (nil: the engine's own).
    var chunks: (size: Int, parallel: Int)? { get }
    /// What the daemon must be told besides the URL (an S3 endpoint and region).
    var daemonArguments: [String] { get }
    /// Opens the store.
    func open(_ how: StoreOpening) async throws -> OpenedStore
}

/// What a store URL is read with: the command line's options for it, and the environment.
public struct StoreURLOptions: Sendable {
    public var s3Endpoint: String?
    public var s3Region: String?
    public var environment: [String: String]
    /// A path as the command line takes it, absolute (`ubiq`'s `Paths.absolute`).
    public var absolute: @Sendable (String) -> String

    public init(s3Endpoint: String? = nil, s3Region: String? = nil,
                environment: [String: String] = ProcessInfo.processInfo.environment,
                absolute: @escaping @Sendable (String) -> String) {
        self.s3Endpoint = s3Endpoint
        self.s3Region = s3Region
        self.environment = environment
        self.absolute = absolute
    }
}

/// How a store is opened.
public struct StoreOpening: Sendable {
    /// Where a store that keeps a local index of itself keeps it (S3's).
    public var indexPath: String
    public var logger: Logger
    /// How often a store whose changes come from a log lists everything anyway.
    public var fullListingInterval: TimeInterval
    /// Only a store that is there already (a command that reads one), none made anew.
    public var mustExist: Bool

    public init(indexPath: String, logger: Logger, fullListingInterval: TimeInterval = 300, mustExist: Bool = false) {
        self.indexPath = indexPath
        self.logger = logger
        self.fullListingInterval = fullListingInterval
        self.mustExist = mustExist
    }
}

/// An opened store, and what of it a device binds to.
public struct OpenedStore: Sendable {
    public var store: any CloudStore
    /// The store's own name, made with it, where it has one: a device remembers the one it
    /// synced with and takes no other made anew in its place.
    public var identity: String?
    /// Sets the store's quota (nil: none), where ubiq keeps one.
    public var setQuota: (@Sendable (Int64?) throws -> Void)?

    public init(store: any CloudStore, identity: String? = nil, setQuota: (@Sendable (Int64?) throws -> Void)? = nil) {
        self.store = store
        self.identity = identity
        self.setQuota = setQuota
    }
}

/// A store URL that names a backend's store wrongly: one line for the user.
public struct StoreURLError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// The embedded store: a folder (`dir:PATH`, or a plain path).
public struct DirectoryBackend: StoreBackend {
    public let path: String

    public static func parse(_ url: String, _ options: StoreURLOptions) throws -> DirectoryBackend? {
        // A scheme ubiq does not know, or a mistyped one ("s3:/bucket", "S3:bucket"), is not
        // taken for a relative path: with --create-store that made a folder called "s3:".
        if hasOtherScheme(url) { return nil }
        guard url.hasPrefix("dir:") || !url.contains("://") else { return nil }
        let path = url.hasPrefix("dir:") ? String(url.dropFirst(4)) : url
        // Never the current directory by accident.
        if path.isEmpty { throw StoreURLError("the store needs a path: dir:PATH") }
        return DirectoryBackend(path: options.absolute(path))
    }

    public init(path: String) { self.path = path }

    /// Whether `url` begins with a scheme other than `dir:` (`s3:`, `gs:`, `S3:`): no path.
    public static func hasOtherScheme(_ url: String) -> Bool {
        guard !url.hasPrefix("dir:"), let colon = url.firstIndex(of: ":") else { return false }
        return url[..<colon].range(of: "^[A-Za-z][A-Za-z0-9+.-]*$", options: .regularExpression) != nil
    }

    public var url: String { "dir:" + path }
    public var address: String { "dir:" }
    public var folder: String? { path }
    public var transfers: Int { 4 }
    public var chunks: (size: Int, parallel: Int)? { nil }
    public var daemonArguments: [String] { [] }

    public func open(_ how: StoreOpening) async throws -> OpenedStore {
        if how.mustExist && !DirectoryStore.isStore(at: path) { throw StoreURLError("no store at \(path)") }
        let store = try DirectoryStore(root: URL(fileURLWithPath: path))
        return OpenedStore(store: store, identity: store.identity, setQuota: { try store.setQuota($0) })
    }
}
