import ArgumentParser
import Foundation
import Logging
import UbiqStore
import UbiqSync

struct KV: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kv",
        abstract: "The synced key-value store: small settings for apps and scripts.",
        discussion: """
            Like iCloud's key-value store: values are strings, numbers, booleans, JSON or bytes
            (base64 on the command line); at most 1,024 keys of at most 64 bytes, 1 MB in all.
            The last write wins, key by key (the later time; on a tie, the greater device id).
            The commands work on the store directly (--store), mounted or not.

            Examples:
              ubiq kv set --store dir:/srv/s theme dark
              ubiq kv set --store dir:/srv/s --type json window '{"w": 800, "h": 600}'
              ubiq kv get --store dir:/srv/s theme
              ubiq kv list --store s3://bucket/drive --s3-endpoint http://nas:8333 --json
              ubiq kv watch --store dir:/srv/s
            """,
        subcommands: [KVGet.self, KVSet.self, KVRemove.self, KVList.self, KVWatch.self])
}

/// Which store, and who this device is to it.
struct KVTarget: ParsableArguments {
    @Option(help: ArgumentHelp("The store: dir:PATH, PATH or s3://BUCKET/PREFIX.", valueName: "URL"))
    var store: String

    @Option(help: ArgumentHelp("S3 service address for an s3:// store.", valueName: "URL"))
    var s3Endpoint: String?

    @Option(help: ArgumentHelp("S3 region for signing.", valueName: "REGION"))
    var s3Region: String?

    /// The store's client, as this user's command-line device (an id kept in the state home).
    func client() throws -> KVStoreClient {
        let spec = try MountPlan.parseStore(store, s3Endpoint: s3Endpoint, s3Region: s3Region)
        if case .directory(let path) = spec, !FileManager.default.fileExists(atPath: path + "/store.db") {
            throw UserError("no store at \(path)")
        }
        let dir = Paths.stateHome + "/ubiq"
        try? FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true,
                                                 attributes: [.posixPermissions: 0o700])
        let idFile = dir + "/kv-device"
        var device = (try? String(contentsOfFile: idFile, encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
        if device.isEmpty {
            device = UUID().uuidString.lowercased()
            try? device.write(toFile: idFile, atomically: true, encoding: .utf8)
        }
        let logger = Logger(label: "ubiq-kv") { _ in SwiftLogNoOpLogHandler() }
        let index = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-kv-index-\(getpid()).db").path
        let opened = try MountPlan.openStore(spec, indexPath: index, logger: logger)
        atexit { for s in ["", "-wal", "-shm"] { unlink(FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-kv-index-\(getpid()).db").path + s) } }
        return KVStoreClient(store: opened, device: device)
    }
}

/// Runs `body` and turns its errors into one line.
func kvRun<T>(_ body: @escaping @Sendable () async throws -> T) -> T {
    do { return try runBlocking(body) } catch let e as UserError { fail(e.message) } catch let e as KVError {
        fail(e.description)
    } catch { fail("\(error)") }
}

func kvNowNs() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

func kvJSON(_ e: KVEntry, extra: [String: Any] = [:]) -> String {
    var o: [String: Any] = ["key": e.key, "timeNs": e.timeNs, "device": e.device]
    if let v = e.value { o.merge(v.jsonObject) { a, _ in a } } else { o["removed"] = true }
    o.merge(extra) { a, _ in a }
    let d = (try? JSONSerialization.data(withJSONObject: o, options: [.sortedKeys, .fragmentsAllowed])) ?? Data()
    return String(decoding: d, as: UTF8.self)
}

struct KVGet: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "get", abstract: "Print a key's value (exit status 1 when it has none).")
    @OptionGroup var target: KVTarget
    @Flag(help: "As JSON: key, type, value, time and device.") var json = false
    @Argument var key: String

    func run() throws {
        let client: KVStoreClient
        do { client = try target.client() } catch { fail("\(error)") }
        let key = self.key
        let e = kvRun { try await client.get(key) }
        guard let e, let v = e.value else { fail("no value for \(key.debugDescription)") }
        print(json ? kvJSON(e) : v.display)
    }
}

struct KVSet: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "set", abstract: "Set a key's value.")
    @OptionGroup var target: KVTarget
    @Option(help: "string, number, bool, json or bytes (base64).") var type = "string"
    @Argument var key: String
    @Argument var value: String

    func run() throws {
        let entry: KVEntry
        do {
            try KVLimits.validate(key: key)
            entry = KVEntry(key: key, value: try KVValue.parse(value, as: type), timeNs: kvNowNs(), device: "")
        } catch { fail("\(error)") }
        let client: KVStoreClient
        do { client = try target.client() } catch { fail("\(error)") }
        var mine = entry
        mine.device = client.device
        let written = mine
        let now = kvRun { try await client.write(written) }
        if now != written { print("a later value from another device stands: \(now.value?.display ?? "(removed)")") }
    }
}

struct KVRemove: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "remove", abstract: "Remove a key.")
    @OptionGroup var target: KVTarget
    @Argument var key: String

    func run() throws {
        do { try KVLimits.validate(key: key) } catch { fail("\(error)") }
        let client: KVStoreClient
        do { client = try target.client() } catch { fail("\(error)") }
        let entry = KVEntry(key: key, value: nil, timeNs: kvNowNs(), device: client.device)
        let now = kvRun { try await client.write(entry) }
        if now != entry { print("a later value from another device stands: \(now.value?.display ?? "(removed)")") }
    }
}

struct KVList: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "Print every key and its value.")
    @OptionGroup var target: KVTarget
    @Flag(help: "One JSON object per line.") var json = false

    func run() throws {
        let client: KVStoreClient
        do { client = try target.client() } catch { fail("\(error)") }
        for e in kvRun({ try await client.list() }) {
            print(json ? kvJSON(e) : "\(e.key)\t\(e.value?.display ?? "")")
        }
    }
}

struct KVWatch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print changes from other devices as JSON lines, until interrupted.",
        discussion: """
            Each line names the changed keys and the reason: "initial-sync" for what the store
            holds when the watch starts, "changed" for a set or remove from another device.
            """)
    @OptionGroup var target: KVTarget
    @Option(help: "Seconds between looks at the store.") var interval: Double = 2

    func run() throws {
        let client: KVStoreClient
        do { client = try target.client() } catch { fail("\(error)") }
        var versions: [String: String] = [:]
        var first = true
        while true {
            let seen = versions
            let (all, now) = kvRun { try await client.changes(from: seen) }
            versions = now
            let changed = all.filter { first || $0.device != client.device }
            if !changed.isEmpty || first {
                let reason = first ? "initial-sync" : "changed"
                let o: [String: Any] = ["reason": reason, "keys": changed.map(\.key),
                                        "values": changed.map { e -> [String: Any] in
                                            var v: [String: Any] = ["key": e.key, "device": e.device, "timeNs": e.timeNs]
                                            if let value = e.value { v.merge(value.jsonObject) { a, _ in a } } else { v["removed"] = true }
                                            return v
                                        }]
                if let d = try? JSONSerialization.data(withJSONObject: o, options: [.sortedKeys]) {
                    FileHandle.standardOutput.write(d + Data("\n".utf8))  // a line at a time, unbuffered
                }
            }
            first = false
            Thread.sleep(forTimeInterval: max(0.2, interval))
        }
    }
}
