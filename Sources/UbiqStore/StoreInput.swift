import Foundation

// What a store sends is input like any other: another device, a newer client or a hostile
// writer may have put anything there. Here is what a device takes of it, and what it leaves.

extension ObjectMetadata {
    /// Reads each field on its own: a field that does not decode (a negative mode, an unknown
    /// kind, a link target that is not base64) is its default, named in `issues`; only a text
    /// that is not a JSON object at all fails.
    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        var issues: [String] = []
        func field<T: Decodable>(_ key: CodingKeys, _ type: T.Type) -> T? {
            do { return try c.decodeIfPresent(T.self, forKey: key) } catch {
                issues.append("\(key.stringValue) unreadable")
                return nil
            }
        }
        let kindName = field(.kind, String.self)
        if let kindName, let k = ObjectKind(rawValue: kindName) { kind = k } else {
            kind = .file
            issues.append(kindName.map { "kind \($0.debugDescription) unknown" } ?? "kind missing")
        }
        mode = field(.mode, UInt32.self).map { $0 & 0o7777 } ?? 0o644
        uid = field(.uid, UInt32.self) ?? getuid()
        gid = field(.gid, UInt32.self) ?? getgid()
        mtimeNs = field(.mtimeNs, Int64.self) ?? 0
        rdev = field(.rdev, UInt64.self) ?? 0
        target = field(.target, Data.self)
        let (kept, dropped) = XattrLimits.within(field(.xattrs, [String: Data].self) ?? [:])
        xattrs = kept
        if dropped > 0 { issues.append("\(dropped) extended attributes over the limits left out") }
        origin = field(.origin, String.self)
        device = field(.device, String.self)
        sha256 = field(.sha256, String.self)
        fileID = field(.fileID, String.self)
        if let id = fileID, !Self.isFileID(id) {
            fileID = nil
            issues.append("fileID not an id")
        }
        self.issues = issues
    }

    /// Metadata from their JSON text: read by `PlainJSON` where every field is as this client
    /// writes it (a tenth of JSONDecoder's time: a fresh device reads a snapshot's million), else
    /// by JSONDecoder, field by field, as `init(from:)` says. The two give the same metadata for
    /// any text the first reads (`PlainJSONTests`).
    public static func read(json data: Data) throws -> ObjectMetadata {
        if let o = PlainJSON.parse(data)?.object, let m = plain(o) { return m }
        return try JSONDecoder().decode(ObjectMetadata.self, from: data)
    }

    /// The metadata a JSON object plainly holds; nil when any field is not as this client
    /// writes it (JSONDecoder then reads it, with its defaults and `issues`).
    public static func plain(_ o: [String: PlainJSON.Value]) -> ObjectMetadata? {
        func field<T>(_ key: CodingKeys, _ read: (PlainJSON.Value) -> T?) -> T?? {
            guard let v = o[key.stringValue], v != .null else { return .some(nil) }  // absent: the default
            guard let t = read(v) else { return nil }
            return .some(t)
        }
        /// base64 as JSONEncoder writes it (anything else is JSONDecoder's to judge).
        func base64(_ v: PlainJSON.Value) -> Data? {
            guard let s = v.string, let d = Data(base64Encoded: s), d.base64EncodedString() == s else { return nil }
            return d
        }
        guard let kindName = o[CodingKeys.kind.stringValue]?.string, let kind = ObjectKind(rawValue: kindName),
              let mode = field(.mode, { $0.integer(UInt32.self) }), let uid = field(.uid, { $0.integer(UInt32.self) }),
              let gid = field(.gid, { $0.integer(UInt32.self) }), let mtime = field(.mtimeNs, { $0.integer(Int64.self) }),
              let rdev = field(.rdev, { $0.integer(UInt64.self) }), let target = field(.target, base64),
              let xattrObject = field(.xattrs, \.object), let origin = field(.origin, \.string),
              let device = field(.device, \.string), let sha = field(.sha256, \.string), let fileID = field(.fileID, \.string)
        else { return nil }
        var xattrs: [String: Data] = [:]
        for (k, v) in xattrObject ?? [:] {
            guard let d = base64(v) else { return nil }
            xattrs[k] = d
        }
        if XattrLimits.within(xattrs).dropped > 0 { return nil }
        if let fileID, !isFileID(fileID) { return nil }
        return ObjectMetadata(kind: kind, mode: (mode ?? 0o644) & 0o7777, uid: uid ?? getuid(), gid: gid ?? getgid(),
                              mtimeNs: mtime ?? 0, rdev: rdev ?? 0, target: target, xattrs: xattrs, origin: origin,
                              device: device, sha256: sha, fileID: fileID)
    }

    /// These metadata as JSON, written field by field (`PlainJSONWriter`): what JSONEncoder
    /// writes, without its Codable path (8% of a fresh mount's CPU, remembering a snapshot's
    /// metadata). Read back as they were by both readers (`PlainJSONTests`).
    public var json: Data {
        var w = PlainJSONWriter()
        w.field(CodingKeys.kind.stringValue, kind.rawValue)
        w.field(CodingKeys.mode.stringValue, mode)
        w.field(CodingKeys.uid.stringValue, uid)
        w.field(CodingKeys.gid.stringValue, gid)
        w.field(CodingKeys.mtimeNs.stringValue, mtimeNs)
        w.field(CodingKeys.rdev.stringValue, rdev)
        w.field(CodingKeys.target.stringValue, target)
        var x = PlainJSONWriter()
        for (k, v) in xattrs.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) { x.field(k, v) }
        w.field(CodingKeys.xattrs.stringValue, object: x)
        w.field(CodingKeys.origin.stringValue, origin)
        w.field(CodingKeys.device.stringValue, device)
        w.field(CodingKeys.sha256.stringValue, sha256)
        w.field(CodingKeys.fileID.stringValue, fileID)
        return Data(w.done)
    }

    /// Metadata a device can take for an object whose own could not be read at all: that of an
    /// object another tool wrote (a file 0644, a folder 0755, owned by this user).
    public static func unreadable(key: String, why: String) -> ObjectMetadata {
        var m = ObjectMetadata(kind: key.hasSuffix("/") ? .directory : .file, mode: key.hasSuffix("/") ? 0o755 : 0o644,
                               uid: getuid(), gid: getgid())
        m.issues = ["unreadable (\(why))"]
        return m
    }
}

extension ObjectInfo {
    /// The largest file a device takes: what ext4 holds (16 TiB), more than S3 keeps (5 TiB).
    public static let maxSize: Int64 = 1 << 44
    /// The longest link target a local disk takes (PATH_MAX less its NUL).
    public static let maxLinkTarget = 4095

    /// Why a device cannot take this object as an item (nil: it can). Such an object is left
    /// out, with a warning; everything else goes on.
    public var unusable: String? {
        if let defect { return defect }
        if size < 0 { return "its size is negative (\(size))" }
        if size > Self.maxSize { return "its size (\(size) bytes) is beyond what any disk holds" }
        if metadata.kind == .symlink && !key.hasSuffix("/") {
            guard let t = metadata.target, !t.isEmpty else { return "a link without a target" }
            if t.contains(0) { return "its link target holds a NUL byte" }
            if t.count > Self.maxLinkTarget { return "its link target is \(t.count) bytes (at most \(Self.maxLinkTarget))" }
        }
        return nil
    }

    /// What a device says of this object as it takes it from the store, if anything: why it is
    /// left out (`leftOut`), or which fields it reads with defaults. One wording for the
    /// mount's listing and for the change feed.
    public var inputWarning: (message: String, leftOut: Bool)? {
        if let why = unusable { return ("skipping \(key.debugDescription) from the store: \(why)", true) }
        if metadata.issues.isEmpty { return nil }
        return ("\(key.debugDescription) from the store: metadata read with defaults (\(metadata.issues.joined(separator: ", ")))", false)
    }
}

/// What one item may carry in extended attributes, here and from the store: a name up to 255
/// bytes and a value up to 64 KiB (Linux's and XFS's limits), and 256 KiB of names and values
/// in all (ext4 holds about 4 KiB without `ea_inode`; this is more, and bounded). Past them a
/// write gets ENOSPC, as a full ext4 says; the store's are left out.
public enum XattrLimits {
    public static let nameBytes = 255
    public static let valueBytes = 65536
    public static let totalBytes = 256 << 10

    /// `xattrs` within the limits (taken in name order, as bytes) and how many were left out.
    public static func within(_ xattrs: [String: Data]) -> (kept: [String: Data], dropped: Int) {
        var kept: [String: Data] = [:]
        var total = 0, dropped = 0
        for k in xattrs.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
            let v = xattrs[k]!, size = k.utf8.count + v.count
            if k.utf8.count > nameBytes || k.isEmpty || v.count > valueBytes || total + size > totalBytes || kept[k] != nil {
                dropped += 1
                continue
            }
            kept[k] = v
            total += size
        }
        return (kept, dropped)
    }
}

/// A store key compared as bytes. Swift's `String` compares and hashes by canonical
/// equivalence, so NFC "é" and NFD "é" are one String; they are two keys in a store and two
/// names on a Linux disk. Sets and dictionaries of keys use this.
public struct KeyBytes: Hashable, Sendable, Comparable {
    public let key: String
    public init(_ key: String) { self.key = key }
    public static func == (a: KeyBytes, b: KeyBytes) -> Bool { a.key.utf8.elementsEqual(b.key.utf8) }
    public func hash(into h: inout Hasher) { for b in key.utf8 { h.combine(b) } }
    public static func < (a: KeyBytes, b: KeyBytes) -> Bool { a.key.utf8.lexicographicallyPrecedes(b.key.utf8) }
}

extension String {
    /// Whether two keys (or names) are the same bytes (`==` is canonical equivalence).
    public func sameBytes(_ other: String) -> Bool { utf8.elementsEqual(other.utf8) }
}
