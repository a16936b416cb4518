import Foundation
import Logging
import UbiqS3

/// One real SeaweedFS (master, volume, filer, S3 gateway) on loopback for this test process,
/// started on first use by scripts/start-seaweedfs and stopped when the process exits (the
/// store tests' and the file system's tests on S3; the mount tests start their own).
public final class SeaweedFS: @unchecked Sendable {
    public let dir: String
    public let endpoint: URL
    public let accessKey: String
    public let secretKey: String

    private static let lock = NSLock()
    nonisolated(unsafe) private static var started: Result<SeaweedFS, Error>?

    struct StartError: Error, CustomStringConvertible { let description: String }

    /// The server, started if it is not yet.
    public static func shared() throws -> SeaweedFS {
        lock.lock(); defer { lock.unlock() }
        if let started { return try started.get() }
        let r = Result { try SeaweedFS() }
        started = r
        if case .success = r { atexit { SeaweedFS.stopShared() } }
        return try r.get()
    }

    /// Not waited for: this runs while the process exits, when other threads (devices' loops
    /// of the tests) still run, and what exit already tore down is there for them to meet. A
    /// stop that waited for the server (seconds) made that window wide enough for a crash after
    /// every test had passed. The stop, and the removal of the server's folder, go on in a
    /// process of their own, in a process group of its own, with no output of this one's held open.
    private static func stopShared() {
        guard case .success(let s) = started else { return }
        detach(["/bin/sh", "-c", "\"$0\" stop \"$1\" >/dev/null 2>&1; rm -rf \"$1\"", script, s.dir])
    }

    private static func detach(_ args: [String]) {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd: Int32 in 0 ... 2 { posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETPGROUP))  // group 0: one of its own
        var argv = args.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        _ = posix_spawn(&pid, args[0], &actions, &attributes, &argv, environ)
    }

    static var script: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("scripts/start-seaweedfs").path
    }

    private init() throws {
        dir = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3-\(UUID().uuidString.prefix(8))").path
        let (status, out, err) = Self.run([Self.script, "start", dir])
        guard status == 0 else { throw StartError(description: "cannot start SeaweedFS: \(err)\(out)") }
        var values: [String: String] = [:]
        for line in out.split(separator: "\n") where line.hasPrefix("export ") {
            let kv = line.dropFirst(7).split(separator: "=", maxSplits: 1)
            if kv.count == 2 { values[String(kv[0])] = String(kv[1]) }
        }
        guard let e = values["UBIQ_S3_ENDPOINT"].flatMap(URL.init(string:)), let a = values["AWS_ACCESS_KEY_ID"],
              let s = values["AWS_SECRET_ACCESS_KEY"] else { throw StartError(description: "start-seaweedfs said: \(out)") }
        endpoint = e; accessKey = a; secretKey = s
    }

    static func run(_ args: [String]) -> (Int32, String, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = args
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        do { try p.run() } catch { return (-1, "", "\(error)") }
        let o = out.fileHandleForReading.readDataToEndOfFile(), e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: o, as: UTF8.self), String(decoding: e, as: UTF8.self))
    }

    public var credentials: S3Credentials { S3Credentials(accessKey: accessKey, secretKey: secretKey, source: "test") }

    /// A client of a new bucket of its own (created).
    public func newBucket(_ label: String = "t") async throws -> S3Client {
        let name = "\(label)-\(UUID().uuidString.prefix(8).lowercased())"
        let client = S3Client(endpoint: S3Endpoint(url: endpoint, region: "us-east-1", bucket: name, credentials: credentials),
                              logger: Logger(label: "s3-test"))
        try await client.send(.PUT, key: nil)
        return client
    }
}

extension SeaweedFS {
    /// An S3 store in a new bucket of its own (with versioning when asked), its index in a
    /// temporary file; the cleanup removes the index.
    /// `settleWindow`: the store's (`S3Store.settleWindow`; 0 for a test that writes nothing
    /// twice in a second and would otherwise wait for the server's clock).
    public func newStore(versioned: Bool, prefix: String = "drive", multipartThreshold: Int64 = 64 << 20,
                  fullListingInterval: TimeInterval = 300, snapshotInterval: TimeInterval = 86_400,
                  settleWindow: TimeInterval? = nil) async throws -> (S3Store, cleanup: () -> Void) {
        let client = try await newBucket(versioned ? "sv" : "su")
        if versioned {
            let enable = "<VersioningConfiguration xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Status>Enabled</Status></VersioningConfiguration>"
            try await client.send(.PUT, key: nil, query: [("versioning", "")], body: .data(Data(enable.utf8)))
        }
        return try await store(of: client.endpoint.bucket, prefix: prefix, multipartThreshold: multipartThreshold,
                               fullListingInterval: fullListingInterval, snapshotInterval: snapshotInterval,
                               settleWindow: settleWindow)
    }

    /// An S3 store of `bucket` (as another device sees it: an index of its own, at `index` when
    /// given: the same device again); the cleanup removes the index.
    public func store(of bucket: String, prefix: String = "drive", multipartThreshold: Int64 = 64 << 20,
               fullListingInterval: TimeInterval = 300, snapshotInterval: TimeInterval = 86_400,
               index: String? = nil, settleWindow: TimeInterval? = nil) async throws -> (S3Store, cleanup: () -> Void) {
        let index = index ?? FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-s3index-\(UUID().uuidString).db").path
        let store = try await S3Store.open(try S3Location("s3://\(bucket)/\(prefix)"), endpoint: endpoint,
                                           region: "us-east-1", credentials: credentials, indexPath: index,
                                           logger: Logger(label: "s3-store-test"), multipartThreshold: multipartThreshold,
                                           fullListingInterval: fullListingInterval, snapshotInterval: snapshotInterval)
        if let settleWindow { store.settleWindow = settleWindow }
        return (store, { unlink(index); unlink(index + "-wal"); unlink(index + "-shm") })
    }
}
