import Foundation
import UbiqStore

/// A value of the synced key-value store (`ubiq kv`): what NSUbiquitousKeyValueStore keeps.
public enum KVValue: Equatable, Sendable {
    case string(String)
    case number(Double)
    case bool(Bool)
    /// JSON text (an object, an array, or any JSON value), kept as given.
    case json(String)
    case bytes(Data)

    public var typeName: String {
        switch self {
        case .string: return "string"
        case .number: return "number"
        case .bool: return "bool"
        case .json: return "json"
        case .bytes: return "bytes"
        }
    }

    /// The bytes it counts for against the 1 MB limit.
    public var size: Int {
        switch self {
        case .string(let s): return s.utf8.count
        case .number: return 8
        case .bool: return 1
        case .json(let t): return t.utf8.count
        case .bytes(let d): return d.count
        }
    }

    /// Parses `text` as a value of `type` (the command line's form: bytes in base64).
    public static func parse(_ text: String, as type: String) throws -> KVValue {
        switch type {
        case "string": return .string(text)
        case "number":
            guard let d = Double(text), d.isFinite else { throw KVError("\(text.debugDescription) is not a number") }
            return .number(d)
        case "bool":
            switch text.lowercased() {
            case "true", "yes", "1": return .bool(true)
            case "false", "no", "0": return .bool(false)
            default: throw KVError("\(text.debugDescription) is not a boolean (true or false)")
            }
        case "json":
            guard let data = text.data(using: .utf8),
                  (try? JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])) != nil else {
                throw KVError("the value is not valid JSON")
            }
            return .json(text)
        case "bytes":
            guard let d = Data(base64Encoded: text) else { throw KVError("the value is not base64") }
            return .bytes(d)
        default:
            throw KVError("unknown type \(type): use string, number, bool, json or bytes")
        }
    }

    /// As JSON: `{"type": ..., "value": ...}` (bytes in base64).
    public var jsonObject: [String: Any] {
        switch self {
        case .string(let s): return ["type": "string", "value": s]
        case .number(let d): return ["type": "number", "value": d]
        case .bool(let b): return ["type": "bool", "value": b]
        case .json(let t):
            let v = (try? JSONSerialization.jsonObject(with: Data(t.utf8), options: [.fragmentsAllowed])) ?? NSNull()
            return ["type": "json", "value": v]
        case .bytes(let d): return ["type": "bytes", "value": d.base64EncodedString()]
        }
    }

    static func from(jsonObject o: [String: Any]) -> KVValue? {
        switch o["type"] as? String {
        case "string": return (o["value"] as? String).map { .string($0) }
        case "number": return (o["value"] as? NSNumber).map { .number($0.doubleValue) }
        case "bool": return (o["value"] as? NSNumber).map { .bool($0.boolValue) }
        case "json":
            guard let v = o["value"], let d = try? JSONSerialization.data(withJSONObject: v, options: [.fragmentsAllowed, .sortedKeys]) else { return nil }
            return .json(String(decoding: d, as: UTF8.self))
        case "bytes": return (o["value"] as? String).flatMap { Data(base64Encoded: $0) }.map { .bytes($0) }
        default: return nil
        }
    }

    /// The value as `ubiq kv get` prints it: text as is, bytes in base64.
    public var display: String {
        switch self {
        case .string(let s): return s
        case .number(let d): return d == d.rounded() && abs(d) < 1e15 ? String(Int64(d)) : String(d)
        case .bool(let b): return b ? "true" : "false"
        case .json(let t): return t
        case .bytes(let d): return d.base64EncodedString()
        }
    }
}

/// One key's state: its value, or its removal, and who wrote it when.
public struct KVEntry: Equatable, Sendable {
    public var key: String
    /// nil: removed.
    public var value: KVValue?
    public var timeNs: Int64
    public var device: String

    public init(key: String, value: KVValue?, timeNs: Int64, device: String) {
        self.key = key; self.value = value; self.timeNs = timeNs; self.device = device
    }

    /// Last writer wins: the later time, then the greater device id (the same everywhere).
    public func beats(_ other: KVEntry) -> Bool {
        timeNs != other.timeNs ? timeNs > other.timeNs : device > other.device
    }

    public var size: Int { value.map { key.utf8.count + $0.size } ?? 0 }

    /// The stored form (the object's body).
    public func encoded() -> Data {
        var o: [String: Any] = ["key": key, "timeNs": timeNs, "device": device]
        if let value { o["value"] = value.jsonObject } else { o["removed"] = true }
        return (try? JSONSerialization.data(withJSONObject: o, options: [.sortedKeys])) ?? Data()
    }

    public static func decode(_ data: Data) -> KVEntry? {
        guard let o = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any], let key = o["key"] as? String,
              let time = (o["timeNs"] as? NSNumber)?.int64Value, let device = o["device"] as? String else { return nil }
        if o["removed"] as? Bool == true { return KVEntry(key: key, value: nil, timeNs: time, device: device) }
        guard let v = (o["value"] as? [String: Any]).flatMap(KVValue.from(jsonObject:)) else { return nil }
        return KVEntry(key: key, value: v, timeNs: time, device: device)
    }
}

public struct KVError: Error, CustomStringConvertible, Equatable {
    public let description: String
    public init(_ d: String) { description = d }
}

/// Apple's limits for NSUbiquitousKeyValueStore.
public enum KVLimits {
    public static let totalBytes = 1 << 20
    public static let maxKeys = 1024
    public static let maxKeyBytes = 64

    public static func validate(key: String) throws {
        if key.isEmpty { throw KVError("a key cannot be empty") }
        if key.utf8.count > maxKeyBytes { throw KVError("key \(key.debugDescription) is \(key.utf8.count) bytes of UTF-8: at most \(maxKeyBytes)") }
    }

    /// Throws when `entry` would take the store over a limit, `current` being what it holds.
    public static func check(_ entry: KVEntry, against current: [String: KVEntry]) throws {
        guard entry.value != nil else { return }
        let others = current.values.filter { $0.key != entry.key && $0.value != nil }
        if others.count + 1 > maxKeys {
            throw KVError("the key-value store holds \(others.count) keys: at most \(maxKeys)")
        }
        let total = others.reduce(0) { $0 + $1.size } + entry.size
        if total > totalBytes {
            throw KVError("the key-value store would hold \(total) bytes: at most \(totalBytes) (1 MB) in all")
        }
    }
}

/// The key-value store kept in a CloudStore, one object per key under `.ubiquity/kv/` (the key
/// in hex), its body the entry as JSON. The object's metadata carries the entry's time, writer
/// and size, so a listing tells the totals without reading values. A removal is kept as an
/// entry without value, so it wins over older sets on every device.
public struct KVStoreClient: Sendable {
    public let store: any CloudStore
    public let device: String

    public init(store: any CloudStore, device: String) { self.store = store; self.device = device }

    public static func objectKey(_ key: String) -> String {
        ReservedKeys.kv + key.utf8.map { String(format: "%02x", $0) }.joined()
    }

    static func metadata(_ e: KVEntry) -> ObjectMetadata {
        ObjectMetadata(kind: .file, mode: 0o600, mtimeNs: e.timeNs,
                       xattrs: ["kv.size": Data(String(e.size).utf8), "kv.removed": Data((e.value == nil ? "1" : "0").utf8)],
                       origin: "\(e.device):kv:\(e.timeNs)", device: e.device)
    }

    /// What a listing says of an entry, without its value: key size, time, writer, removed.
    struct Summary { var size: Int; var timeNs: Int64; var device: String; var removed: Bool }

    static func summary(_ info: ObjectInfo) -> Summary {
        let m = info.metadata
        let size = m.xattrs["kv.size"].flatMap { Int(String(decoding: $0, as: UTF8.self)) } ?? Int(info.size)
        return Summary(size: size, timeNs: m.mtimeNs, device: m.device ?? "",
                       removed: m.xattrs["kv.removed"].map { String(decoding: $0, as: UTF8.self) == "1" } ?? false)
    }

    /// The entry at `objectKey` as stored (nil: none), with the object's version.
    public func fetch(objectKey: String) async throws -> (entry: KVEntry, version: String)? {
        let info: ObjectInfo
        do { info = try await store.head(objectKey) } catch StoreError.notFound { return nil }
        var data = Data()
        // A read of another length than the version's own is asked again (a busy server has
        // answered with an empty body), then is the store's failure, not an unreadable entry.
        for attempt in 0 ..< 2 {
            do { data = try await store.read(objectKey, version: info.version, range: 0 ..< max(1, info.size)) } catch StoreError.notFound {
                return try await fetch(objectKey: objectKey)  // replaced meanwhile
            }
            if data.count == info.size { break }
            if attempt == 1 { throw StoreError.unavailable("\(objectKey): read \(data.count) of its \(info.size) bytes") }
        }
        guard let e = KVEntry.decode(data) else { throw KVError("the entry at \(objectKey) in the store is unreadable") }
        return (e, info.version)
    }

    public func get(_ key: String) async throws -> KVEntry? {
        try KVLimits.validate(key: key)
        return try await fetch(objectKey: Self.objectKey(key))?.entry
    }

    /// Every key with a value (removed ones left out).
    public func list() async throws -> [KVEntry] {
        var out: [KVEntry] = []
        for info in try await store.list(prefix: ReservedKeys.kv) where !Self.summary(info).removed {
            if let e = try await fetch(objectKey: info.key)?.entry, e.value != nil { out.append(e) }
        }
        return out.sorted { $0.key < $1.key }
    }

    /// The entries whose object version differs from `versions` (object key → version), read;
    /// and the versions now. One listing, and one read per changed key.
    public func changes(from versions: [String: String]) async throws -> (entries: [KVEntry], versions: [String: String]) {
        var now: [String: String] = [:]
        var out: [KVEntry] = []
        for info in try await store.list(prefix: ReservedKeys.kv) {
            now[info.key] = info.version
            if versions[info.key] != info.version, let e = try await fetch(objectKey: info.key)?.entry { out.append(e) }
        }
        return (out.sorted { $0.key < $1.key }, now)
    }

    /// The key an object key stands for (nil: not a key-value object).
    public static func key(fromObjectKey objectKey: String) -> String? {
        guard objectKey.hasPrefix(ReservedKeys.kv) else { return nil }
        let hex = Array(objectKey.utf8.dropFirst(ReservedKeys.kv.utf8.count))
        guard hex.count % 2 == 0, !hex.isEmpty else { return nil }
        var bytes: [UInt8] = []
        for i in stride(from: 0, to: hex.count, by: 2) {
            guard let b = UInt8(String(decoding: hex[i ..< i + 2], as: UTF8.self), radix: 16) else { return nil }
            bytes.append(b)
        }
        return String(validating: bytes, as: UTF8.self)
    }

    /// What the store holds now, sizes only (for the limits), from one listing.
    func totals() async throws -> [String: KVEntry] {
        var out: [String: KVEntry] = [:]
        for info in try await store.list(prefix: ReservedKeys.kv) {
            let s = Self.summary(info)
            guard !s.removed, let key = Self.key(fromObjectKey: info.key) else { continue }
            // A stand-in value of the entry's size.
            out[key] = KVEntry(key: key, value: .bytes(Data(count: max(0, s.size - key.utf8.count))), timeNs: s.timeNs, device: s.device)
        }
        return out
    }

    /// Writes `entry` unless the store holds a later one for its key; returns what the store
    /// holds after (`entry`, or the later one that beat it). Checks the limits first.
    @discardableResult
    public func write(_ entry: KVEntry) async throws -> KVEntry {
        try KVLimits.validate(key: entry.key)
        let key = Self.objectKey(entry.key)
        if entry.value != nil { try KVLimits.check(entry, against: try await totals()) }
        let body = FileManager.default.temporaryDirectory.appendingPathComponent("ubiq-kv-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: body.path, contents: entry.encoded(), attributes: [.posixPermissions: 0o600]) else {
            throw KVError("cannot write a temporary file in \(body.deletingLastPathComponent().path)")
        }
        defer { unlink(body.path) }
        for _ in 0 ..< 20 {
            let now = try await fetch(objectKey: key)
            if let now, now.entry.beats(entry) { return now.entry }
            do {
                _ = try await store.put(key, contentsOf: body, metadata: Self.metadata(entry),
                                        condition: now.map { .ifMatch($0.version) } ?? .ifAbsent)
                // Other devices' feeds see it at their next poll (`ubiq kv set --store` exits now).
                try? await store.publishChanges()
                return entry
            } catch StoreError.preconditionFailed {
                continue  // another device wrote it meanwhile: compare again
            }
        }
        throw StoreError.unavailable("the key \(entry.key.debugDescription) kept changing in the store")
    }
}

/// Any JSON value, for a `json` value of the key-value store inside Codable messages.
public enum JSONValue: Codable, Equatable, Sendable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let d = try? c.decode(Double.self) { self = .number(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([JSONValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: JSONValue].self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .number(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }

    /// The value as JSON text, keys sorted (as a `json` value is kept).
    public var text: String { jsonText(self) ?? "null" }
}

/// An entry in messages (the control socket): the stored form's keys and values, `value` as
/// `{"type": ..., "value": ...}` or `removed: true`.
extension KVEntry: Codable {
    private enum Keys: String, CodingKey { case key, timeNs, device, value, removed, type }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Keys.self)
        let key = try c.decode(String.self, forKey: .key)
        let time = try c.decode(Int64.self, forKey: .timeNs)
        let device = try c.decodeIfPresent(String.self, forKey: .device) ?? ""
        if try c.decodeIfPresent(Bool.self, forKey: .removed) == true {
            self.init(key: key, value: nil, timeNs: time, device: device)
            return
        }
        let v = try c.nestedContainer(keyedBy: Keys.self, forKey: .value)
        let value: KVValue
        switch try v.decode(String.self, forKey: .type) {
        case "string": value = .string(try v.decode(String.self, forKey: .value))
        case "number": value = .number(try v.decode(Double.self, forKey: .value))
        case "bool": value = .bool(try v.decode(Bool.self, forKey: .value))
        case "json": value = .json(try v.decode(JSONValue.self, forKey: .value).text)
        case "bytes":
            guard let d = Data(base64Encoded: try v.decode(String.self, forKey: .value)) else {
                throw DecodingError.dataCorruptedError(forKey: .value, in: v, debugDescription: "bytes not in base64")
            }
            value = .bytes(d)
        case let t: throw DecodingError.dataCorruptedError(forKey: .type, in: v, debugDescription: "unknown type \(t)")
        }
        self.init(key: key, value: value, timeNs: time, device: device)
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        try c.encode(key, forKey: .key)
        try c.encode(timeNs, forKey: .timeNs)
        try c.encode(device, forKey: .device)
        guard let value else {
            try c.encode(true, forKey: .removed)
            return
        }
        var v = c.nestedContainer(keyedBy: Keys.self, forKey: .value)
        try v.encode(value.typeName, forKey: .type)
        switch value {
        case .string(let s): try v.encode(s, forKey: .value)
        case .number(let d): try v.encode(d, forKey: .value)
        case .bool(let b): try v.encode(b, forKey: .value)
        case .json(let t): try v.encode((try? JSONDecoder().decode(JSONValue.self, from: Data(t.utf8))) ?? .null, forKey: .value)
        case .bytes(let d): try v.encode(d.base64EncodedString(), forKey: .value)
        }
    }
}
