import Foundation
import Logging
import UbiqCoordinator
import UbiqState
import UbiqStore
import UbiqSync

/// One device's engine, wired in one place: the coordinator, the downloads, the uploads, the
/// file system and the change feed, with the back-channels between them. The daemon mounts it
/// (`Sources/ubiq/Daemon.swift`) and the core tests drive it (`Tests/FileSystemTests`,
/// `Device`), so both run the same wiring. Nothing is started: the daemon starts the uploader's
/// and the feed's threads; the tests call their rounds themselves.
public struct Engine {
    public let coordinator: Coordinator
    public let materializer: Materializer
    public let uploader: Uploader
    public let fs: FileSystem
    public let feed: ChangeFeed
    /// The store's changes weighed against this device's and made here (the feed's sink; `fs`
    /// makes them).
    public let remote: RemoteApplier
    /// What local content stays under, and what is evicted to stay there (`fs` is its host).
    public let cacheLimit: CacheLimit
    /// Sync paused by the user (`ubiq pause`): the uploader and the feed wait while it lasts.
    public let pause: SyncPause

    public struct Options: Sendable {
        /// This device's name for people: conflict copies of its versions carry it.
        public var deviceName: String
        /// Download chunk size and fetches at once per file (S3 wants larger ones: docs/s3.md).
        public var chunkSize: Int64 = 1 << 20
        public var parallelism = 4
        /// Downloads go on in the background after the range a read asked for.
        public var completeInBackground = true
        /// How long a read waits for the store.
        public var readTimeout: TimeInterval = 60
        /// Seconds between a file's last change and its upload.
        public var uploadDelay: TimeInterval = 2
        /// Uploads sent to the store at once (`Uploader.transfers`).
        public var transfers = 1
        /// Seconds between polls of the store.
        public var pollInterval: TimeInterval = 3
        public var hydration: HydrationPolicy = .off
        public var cacheLimit: Int64?
        public var syncOnClose = false
        public var accessTimes = AccessTimes.relative
        /// Every store write of the uploader goes to the log.
        public var traceUploads = false
        /// How long a claim waits before it fails with ETIMEDOUT.
        public var claimTimeout: TimeInterval = 30
        /// Nodes of files kept in memory past those that must be (`Inodes`), and whether each
        /// that leaves is compared with its rows first (tests).
        public var residentNodes = FileSystem.defaultResidentLimit
        public var checkNodes = false
        /// How long one `sync` action waits for its uploads (`FileSystem.syncWait`).
        public var syncWait: TimeInterval = 60

        public init(deviceName: String) { self.deviceName = deviceName }
    }

    /// Wires the engine of the device `deviceID` whose state and cache are given, on `store`
    /// (imported already: `ChangeFeed.prepare` and `Importer` run before). `keyValues` hears
    /// the key-value store's changes that the feed finds (a mount of a whole container).
    public init(state: LocalState, store: any CloudStore, cache: ContentCache, deviceID: String, logger: Logger,
                options: Options, keyValues: (any KeyValueSink)? = nil) throws {
        coordinator = Coordinator(defaultTimeout: options.claimTimeout, time: state.time)
        uploader = Uploader(state: state, store: store, coordinator: coordinator, cache: cache, deviceID: deviceID,
                            logger: logger, tracing: options.traceUploads)
        uploader.deviceName = options.deviceName
        uploader.transfers = options.transfers
        materializer = Materializer(store: store, state: state, cache: cache, logger: logger, chunkSize: options.chunkSize,
                                    parallelism: options.parallelism, completeInBackground: options.completeInBackground)
        materializer.readTimeout = options.readTimeout
        cacheLimit = CacheLimit(limit: options.cacheLimit, state: state, logger: logger)
        pause = try SyncPause(state: state)
        uploader.pause = pause
        fs = try FileSystem(state: state, coordinator: coordinator, cache: cache, materializer: materializer,
                            uploader: uploader, logger: logger, uploadDelay: options.uploadDelay,
                            hydration: options.hydration, cacheLimit: cacheLimit, syncOnClose: options.syncOnClose,
                            accessTimes: options.accessTimes,
                            residentLimit: options.residentNodes, checkNodes: options.checkNodes)
        fs.syncWait = options.syncWait
        // The feed holds the applier of its changes, which holds the file system; the file system
        // reaches the feed weakly (no cycle: a test that starts a device again from its state
        // directory lets the old one go). The uploader and downloads reach the file system
        // weakly too (its init).
        remote = RemoteApplier(items: fs, state: state, materializer: materializer, writes: uploader.writes, logger: logger)
        feed = ChangeFeed(store: store, state: state, deviceID: deviceID, logger: logger, interval: options.pollInterval,
                          changes: remote, keyValues: keyValues, writes: uploader.writes)
        feed.pause = pause
        fs.attach(feed: feed)
    }

    /// The item at `path` (relative to the mount) in the store; one clear line when it has
    /// never been uploaded.
    public func storeItem(at path: String) throws -> (key: String, version: String, changedHere: Bool) {
        do { return try fs.storeItem(at: path) } catch FSError.notUploaded {
            throw EngineError("\(path) is not in the store yet: it has versions there once its first upload is done")
        }
    }

    /// What the store keeps of the file at `path`, newest first (`ubiq versions --all`).
    public func history(at path: String) throws -> (key: String, versions: [ObjectInfo]) {
        let item = try storeItem(at: path)
        return (item.key, try uploader.history(of: item.key))
    }

    /// `ubiq restore`: writes `version` of the file at `path` as its newest version, in the
    /// store (nothing is downloaded), then brings that here. Returns the new version. Refused,
    /// changing nothing, while the file has changes here not yet uploaded, when the store's
    /// current version moved meanwhile, or when there is no such version.
    public func restore(path: String, version: String) throws -> String {
        let item = try storeItem(at: path)
        if item.changedHere {
            throw EngineError("\(path) has changes here that are not in the store yet; try again once they are uploaded")
        }
        let made: String?
        do {
            made = try uploader.restore(key: item.key, version: version, over: item.version)
        } catch StoreError.preconditionFailed {
            throw EngineError("\(path) changed in the store meanwhile; run ubiq sync and try again")
        }
        guard let made else { throw EngineError("\(path) has no version \(version) (ubiq versions --all lists them)") }
        try feed.poll()
        return made
    }
}

/// A request of `Engine` refused, said in one line for the person who made it.
public struct EngineError: Error, CustomStringConvertible, Equatable {
    public let description: String
    public init(_ d: String) { description = d }
}
