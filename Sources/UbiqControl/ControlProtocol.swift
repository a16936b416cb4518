import Foundation
import UbiqState
import UbiqStore
import UbiqSync

/// The requests of the control socket (docs/control.md): one JSON object a line, its `op`
/// naming the request. The daemon's server, the CLI and the tests all speak through these
/// types, so a request or an answer is spelled once.
public enum ControlRequest: Sendable, Equatable {
    /// The mount's figures (`StatusReply`).
    case status
    /// Look at the store's changes now, and start pending uploads without waiting. `full`: also
    /// list the whole store (S3: objects other tools put there); `wait`: first wait (a minute
    /// at most) for the uploads pending to go, as `ubiq sync` does.
    case sync(full: Bool, wait: Bool)
    /// The rows of `ubiq query` under the folder `scope`: in one answer (`QueryReply`), or
    /// (`lines`) `{"ok":true}`, then a row a line, then `{"count":N,"end":true}`
    /// (`ControlConnection.query`).
    case query(scope: String, spec: QuerySpec, lines: Bool = false)
    /// What the store keeps of the file at `path` (`HistoryReply`).
    case history(path: String)
    /// Makes `version` of the file at `path` its newest (`RestoreReply`).
    case restore(path: String, version: String)
    /// `{"ok":true}`, then a `WatchEvent` a line for changes under `scope`.
    case watch(scope: String)
    case kvGet(key: String)
    case kvList
    case kvSet(entry: KVEntry)
    /// `{"ok":true}`, then a `KVChange` a line.
    case kvWatch
    /// Pauses sync (uploads and other devices' changes) for `seconds`, or (nil) until `resume`.
    case pause(seconds: Double?)
    case resume

    public var op: String {
        switch self {
        case .status: return "status"
        case .sync: return "sync"
        case .query: return "query"
        case .history: return "history"
        case .restore: return "restore"
        case .watch: return "watch"
        case .kvGet: return "kv-get"
        case .kvList: return "kv-list"
        case .kvSet: return "kv-set"
        case .kvWatch: return "kv-watch"
        case .pause: return "pause"
        case .resume: return "resume"
        }
    }

    /// Whether the connection becomes a stream of lines after the answer.
    public var streams: Bool {
        switch self {
        case .watch, .kvWatch: return true
        default: return false
        }
    }
}

extension ControlRequest: Codable {
    private enum Keys: String, CodingKey { case op, scope, spec, path, version, key, entry, full, wait, lines, seconds }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let op = try c.decode(String.self, forKey: .op)
        func text(_ k: Keys) throws -> String { try c.decodeIfPresent(String.self, forKey: k) ?? "" }
        switch op {
        case "status": self = .status
        case "sync":
            self = .sync(full: try c.decodeIfPresent(Bool.self, forKey: .full) ?? false,
                         wait: try c.decodeIfPresent(Bool.self, forKey: .wait) ?? false)
        case "query":
            self = .query(scope: try text(.scope), spec: try c.decodeIfPresent(QuerySpec.self, forKey: .spec) ?? QuerySpec(),
                          lines: try c.decodeIfPresent(Bool.self, forKey: .lines) ?? false)
        case "history": self = .history(path: try text(.path))
        case "restore": self = .restore(path: try text(.path), version: try text(.version))
        case "watch": self = .watch(scope: try text(.scope))
        case "kv-get": self = .kvGet(key: try text(.key))
        case "kv-list": self = .kvList
        case "kv-set": self = .kvSet(entry: try c.decode(KVEntry.self, forKey: .entry))
        case "kv-watch": self = .kvWatch
        case "pause":
            let seconds = try c.decodeIfPresent(Double.self, forKey: .seconds)
            if let seconds, !(seconds > 0 && seconds.isFinite) { throw ControlError("pause: seconds must be a positive number") }
            self = .pause(seconds: seconds)
        case "resume": self = .resume
        default: throw ControlError("unknown op \(op)")
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(op, forKey: .op)
        switch self {
        case .status, .kvList, .kvWatch, .resume: break
        case .pause(let seconds): if let seconds { try c.encode(seconds, forKey: .seconds) }
        case .sync(let full, let wait):
            if full { try c.encode(full, forKey: .full) }
            if wait { try c.encode(wait, forKey: .wait) }
        case .query(let scope, let spec, let lines):
            try c.encode(scope, forKey: .scope)
            try c.encode(spec, forKey: .spec)
            if lines { try c.encode(lines, forKey: .lines) }
        case .history(let path): try c.encode(path, forKey: .path)
        case .restore(let path, let version):
            try c.encode(path, forKey: .path)
            try c.encode(version, forKey: .version)
        case .watch(let scope): try c.encode(scope, forKey: .scope)
        case .kvGet(let key): try c.encode(key, forKey: .key)
        case .kvSet(let entry): try c.encode(entry, forKey: .entry)
        }
    }
}

/// A refusal, from the daemon (`{"ok":false,"error":...}`) or about the connection.
public struct ControlError: Error, CustomStringConvertible, Equatable {
    public let description: String
    public init(_ d: String) { description = d }
}

/// The answer to every request that fails: `{"ok":false,"error":"..."}`.
struct Refusal: Codable {
    var ok = false
    var error: String
}

/// The answer to `status`. `cacheLimit` and `pid` are strings, as the protocol has always
/// sent them.
public struct StatusReply: Codable, Sendable, Equatable {
    public var ok = true
    public var mount: String
    public var store: String
    public var device: String
    public var deviceName: String
    public var state: String
    public var cacheLimit: String
    public var pid: String
    public var items: Int
    public var cacheBytes: Int64
    public var pendingUploads: Int
    /// When the store's changes were last looked at (ISO 8601), and why that failed.
    public var lastPoll: String?
    public var lastPollError: String?
}

/// What a daemon says of its mount in `StatusReply`, fixed when it starts.
public struct MountInfo: Sendable, Equatable {
    public var mount: String
    public var store: String
    public var device: String
    public var deviceName: String
    public var state: String
    public var cacheLimit: Int64
    public var pid: Int32

    public init(mount: String, store: String, device: String, deviceName: String, state: String, cacheLimit: Int64, pid: Int32) {
        self.mount = mount; self.store = store; self.device = device; self.deviceName = deviceName
        self.state = state; self.cacheLimit = cacheLimit; self.pid = pid
    }
}

/// `{"ok":true}`: the answer of `sync`, and the first line of a stream.
public struct Done: Codable, Sendable, Equatable {
    public var ok = true
    public init() {}
}

public struct QueryReply: Codable, Sendable, Equatable {
    public var ok = true
    public var items: [QueryRow]
}

extension QueryRow {
    /// A row from its line as the daemon writes it (`QueryText`), read plainly (`PlainJSON`):
    /// JSONDecoder took two thirds of `ubiq query`'s time. Nil for anything else (the caller
    /// reads that with JSONDecoder).
    static func plain(_ o: [String: PlainJSON.Value]) -> QueryRow? {
        guard let ino = o["ino"]?.integer(UInt64.self), let path = o["path"]?.string, let name = o["name"]?.string,
              let depth = o["depth"]?.integer(Int.self), let type = o["type"]?.string, let size = o["size"]?.integer(Int64.self),
              let mtime = o["mtimeNs"]?.integer(Int64.self), let status = o["status"]?.string.flatMap(SyncStatus.init(rawValue:)),
              case .bool(let pinned)? = o["pinned"] else { return nil }
        var raw: [UInt8]?
        if let r = o["rawPath"] {
            guard case .array(let bytes) = r else { return nil }
            raw = []
            for b in bytes {
                guard let v = b.integer(UInt8.self) else { return nil }
                raw!.append(v)
            }
        }
        return QueryRow(ino: ino, path: path, rawPath: raw, name: name, depth: depth, type: type, size: size, mtimeNs: mtime,
                        status: status, pinned: pinned)
    }
}

public struct HistoryReply: Codable, Sendable, Equatable {
    public struct Version: Codable, Sendable, Equatable {
        public var version: String
        public var size: Int64
        public var mtimeNs: Int64
        public var device: String
        public var current: Bool
    }
    public var ok = true
    public var storeKey: String
    /// Newest first.
    public var versions: [Version]
}

public struct RestoreReply: Codable, Sendable, Equatable {
    public var ok = true
    /// The new current version: a copy of the one asked for.
    public var version: String
}

/// A line of a `watch` stream: `event` is `changed`, `changed-remotely`, `status`, `conflict`,
/// `deleted`, `moved` (with `from`) or `overflow` (with `dropped`, and no path). Paths are
/// relative to the mount; `rawPath` and `rawFrom` carry the bytes of one that is not valid
/// UTF-8 (the text then shows U+FFFD for them).
public struct WatchEvent: Codable, Sendable, Equatable {
    public var event: String
    public var path: String?
    public var rawPath: [UInt8]?
    public var from: String?
    public var rawFrom: [UInt8]?
    /// A conflict's copy beside the item.
    public var copy: String?
    public var rawCopy: [UInt8]?
    public var time: String?
    public var dropped: Int?

    public init(event: String, path: String? = nil, rawPath: [UInt8]? = nil, from: String? = nil, rawFrom: [UInt8]? = nil,
                copy: String? = nil, rawCopy: [UInt8]? = nil, time: String? = nil, dropped: Int? = nil) {
        self.event = event; self.path = path; self.rawPath = rawPath; self.from = from; self.rawFrom = rawFrom
        self.copy = copy; self.rawCopy = rawCopy
        self.time = time; self.dropped = dropped
    }
}

public struct KVGetReply: Codable, Sendable, Equatable {
    public var ok = true
    public var result: KVEntry?

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(ok, forKey: .ok)
        try c.encode(result, forKey: .result)  // null when there is none
    }
}

public struct KVListReply: Codable, Sendable, Equatable {
    public var ok = true
    public var values: [KVEntry]
}

public struct KVSetReply: Codable, Sendable, Equatable {
    public var ok = true
    /// The entry that stands after the set, and whether it is the one sent.
    public var stands: KVEntry
    public var won: Bool
}

/// A line of a `kv-watch` stream.
public struct KVChange: Codable, Sendable, Equatable {
    /// `changed`, `initial-sync` or `quota`.
    public var reason: String
    public var keys: [String]
    public var entries: [KVEntry]
}
