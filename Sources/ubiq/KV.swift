import ArgumentParser
import Foundation
import Logging
import UbiqControl
import UbiqStore
import UbiqSync

struct KV: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "kv",
        abstract: "The synced key-value store: small settings for apps and scripts.",
        discussion: prose("""
            Like iCloud's key-value store: values are strings, numbers, booleans, JSON or bytes
            (base64 on the command line); at most 1,024 keys of at most 64 bytes, 1 MB in all.
            The last write wins, key by key (the later time; on a tie, the greater device id).
            The commands go through the mount the current directory is in (or --mount PATH):
            a write there is kept by the mount (in its state database, so it survives a crash)
            and sent to the store at once, or when the store is back. With --store they work on
            the store directly, mounted or not.

            Examples:
              ubiq kv set --mount ~/Ubiquity theme dark
              ubiq kv set --store dir:/srv/s theme dark
              ubiq kv set --store dir:/srv/s --type json window '{"w": 800, "h": 600}'
              ubiq kv get --store dir:/srv/s theme
              ubiq kv list --store s3://bucket/drive --s3-endpoint http://nas:8333 --json
              ubiq kv watch --store dir:/srv/s
            """),
        subcommands: [KVGet.self, KVSet.self, KVRemove.self, KVList.self, KVWatch.self])
}

/// Which store, and who this device is to it.
struct KVTarget: ParsableArguments {
    @Option(help: ArgumentHelp("A path in the ubiq mount to use (default: the current directory).", valueName: "PATH"), completion: .directory)
    var mount: String?

    @Option(help: ArgumentHelp("Work on this store directly instead: dir:PATH, PATH or s3://BUCKET/PREFIX.", valueName: "URL"), completion: .directory)
    var store: String?

    @Option(help: ArgumentHelp("S3 service address for an s3:// store.", valueName: "URL"))
    var s3Endpoint: String?

    @Option(help: ArgumentHelp("S3 region for signing.", valueName: "REGION"))
    var s3Region: String?

    @Option(help: ArgumentHelp("With --store: the key-value store of this container.", valueName: "NAME"))
    var container: String?

    /// Where requests go: the store (`--store`), or a mount's daemon.
    enum Backend {
        case store(KVStoreClient)
        case mount(ControlClient)
    }

    func backend() throws -> Backend {
        if store != nil {
            if mount != nil { throw UserError("--mount and --store: say one") }
        } else if container != nil {
            throw UserError("--container goes with --store (a mount of a container reaches its key-value store itself)")
        }
        if store != nil {
            return .store(try client())
        }
        return .mount(ControlClient.connect(for: mount ?? FileManager.default.currentDirectoryPath))
    }

    /// The store's client, as this user's command-line device (an id kept in the state home).
    func client() throws -> KVStoreClient {
        var opened = try openStoreForCLI(store ?? "", s3Endpoint: s3Endpoint, s3Region: s3Region)
        if let container {
            let base = opened
            guard try runBlocking({ try await Containers.config(container, in: base) }) != nil else {
                throw UserError("the store has no container \(container)")
            }
            opened = PrefixStore(base, prefix: Containers.prefix(container))
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
        do { try KVLimits.validate(key: key) } catch { fail("\(error)") }
        let key = self.key
        let e: KVEntry?
        switch kvBackend(target) {
        case .store(let client): e = kvRun { try await client.get(key) }
        case .mount(let c): e = c.request(.kvGet(key: key), as: KVGetReply.self).result
        }
        guard let e, let v = e.value else { fail("no value for \(key.debugDescription)") }
        print(json ? kvJSON(e) : v.display)
    }
}

struct KVSet: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "set", abstract: "Set a key's value.",
        discussion: prose("""
            The value is the argument, or read from a file with --file FILE, or from standard
            input with --file - (or the value -): as much as the store takes (1 MiB in all), where an
            argument is limited by the system's command line. Read from a file, a string is taken
            exactly as it is (printf, not echo, for no final newline), bytes are the file's own
            (not base64), and a number, bool or json may end in white space.

            Examples:
              ubiq kv set --mount ~/Ubiquity theme dark
              ubiq kv set --mount ~/Ubiquity --type json layout --file layout.json
              base64 -d blob.b64 | ubiq kv set --mount ~/Ubiquity --type bytes blob -
            """))
    @OptionGroup var target: KVTarget
    @Option(help: "string, number, bool, json or bytes (base64 as an argument, raw from a file).", completion: .list(["string", "number", "bool", "json", "bytes"])) var type = "string"
    @Option(help: "Read the value from FILE (- for standard input).", completion: .file()) var file: String?
    @Argument var key: String
    @Argument var value: String?

    func run() throws {
        let entry: KVEntry
        do {
            try KVLimits.validate(key: key)
            entry = KVEntry(key: key, value: try readValue(), timeNs: kvNowNs(), device: "")
        } catch { fail("\(error)") }
        kvWrite(entry, target)
    }

    private func readValue() throws -> KVValue {
        let source: String
        switch (value, file) {
        case (let v?, nil) where v != "-": return try KVValue.parse(v, as: type)
        case ("-", nil), (nil, "-"): source = "-"
        case (nil, let f?): source = f
        case (nil, nil): throw KVError("give a value, or --file FILE (- for standard input)")
        default: throw KVError("give a value or --file, not both")
        }
        let handle: FileHandle
        if source == "-" { handle = .standardInput } else {
            guard let h = FileHandle(forReadingAtPath: source) else {
                throw KVError("cannot read \(source): \(String(cString: strerror(errno)))")
            }
            handle = h
        }
        // Not more than the store takes, and a byte over it to say so.
        let data = (try handle.read(upToCount: KVLimits.totalBytes + 1)) ?? Data()
        if data.count > KVLimits.totalBytes {
            throw KVError("the value from \(source == "-" ? "standard input" : source) is over \(KVLimits.totalBytes) bytes, all a key-value store holds")
        }
        switch type {
        case "bytes": return .bytes(data)
        case "string":
            guard let s = String(data: data, encoding: .utf8) else { throw KVError("the value is not UTF-8 text (use --type bytes)") }
            return .string(s)
        default:
            guard let s = String(data: data, encoding: .utf8) else { throw KVError("the value is not UTF-8 text") }
            return try KVValue.parse(s.trimmingCharacters(in: .whitespacesAndNewlines), as: type)
        }
    }
}

func kvBackend(_ target: KVTarget) -> KVTarget.Backend {
    do { return try target.backend() } catch { fail("\(error)") }
}

/// Writes `entry` (its device filled in), and says so when a later value stands.
func kvWrite(_ entry: KVEntry, _ target: KVTarget) {
    var mine = entry
    let stands: KVEntry
    switch kvBackend(target) {
    case .store(let client):
        mine.device = client.device
        let written = mine
        stands = kvRun { try await client.write(written) }
    case .mount(let c):
        let r = c.request(.kvSet(entry: entry), as: KVSetReply.self)
        if r.won { return }
        stands = r.stands
    }
    if stands.timeNs != mine.timeNs || stands.value != mine.value {
        print("a later value from another device stands: \(stands.value?.display ?? "(removed)")")
    }
}

struct KVRemove: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "remove", abstract: "Remove a key.")
    @OptionGroup var target: KVTarget
    @Argument var key: String

    func run() throws {
        do { try KVLimits.validate(key: key) } catch { fail("\(error)") }
        kvWrite(KVEntry(key: key, value: nil, timeNs: kvNowNs(), device: ""), target)
    }
}

struct KVList: ParsableCommand {
    static let configuration = CommandConfiguration(commandName: "list", abstract: "Print every key and its value.")
    @OptionGroup var target: KVTarget
    @Flag(help: "One JSON object per line.") var json = false

    func run() throws {
        let all: [KVEntry]
        switch kvBackend(target) {
        case .store(let client): all = kvRun { try await client.list() }
        case .mount(let c): all = c.request(.kvList, as: KVListReply.self).values
        }
        for e in all {
            print(json ? kvJSON(e) : "\(e.key)\t\(e.value?.display ?? "")")
        }
    }
}

struct KVWatch: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "watch",
        abstract: "Print changes from other devices as JSON lines, until interrupted.",
        discussion: prose("""
            Each line names the changed keys and the reason: "initial-sync" for what the store
            holds when the watch starts, "changed" for a set or remove from another device.
            """))
    @OptionGroup var target: KVTarget
    @Option(help: "Seconds between looks at the store.") var interval: Double = 2

    func validate() throws {
        if let refused = secondsRefused(interval, "--interval") { throw ValidationError(refused) }
    }

    func run() throws {
        let client: KVStoreClient
        switch kvBackend(target) {
        case .store(let c): client = c
        case .mount(let c):
            // The mount's stream: what its feed brings in from other devices.
            _ = c.request(.kvWatch, as: Done.self)
            while let o = c.next(KVChange.self) {
                let line: [String: Any] = ["reason": o.reason, "keys": o.keys, "values": o.entries.map(kvWatchValue)]
                if let d = try? JSONSerialization.data(withJSONObject: line, options: [.sortedKeys]) {
                    FileHandle.standardOutput.write(d + Data("\n".utf8))
                }
            }
            return
        }
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
                                        "values": changed.map(kvWatchValue)]
                if let d = try? JSONSerialization.data(withJSONObject: o, options: [.sortedKeys]) {
                    FileHandle.standardOutput.write(d + Data("\n".utf8))  // a line at a time, unbuffered
                }
            }
            first = false
            Thread.sleep(forTimeInterval: max(0.2, interval))
        }
    }
}

func kvWatchValue(_ e: KVEntry) -> [String: Any] {
    var v: [String: Any] = ["key": e.key, "device": e.device, "timeNs": e.timeNs]
    if let value = e.value { v.merge(value.jsonObject) { a, _ in a } } else { v["removed"] = true }
    return v
}
