import Foundation

/// One write to the state that a file system request makes, as a value: what `LocalState.record`
/// puts in the intent log and applies to the database later, in order, with the others.
/// Each case runs the `StateTransaction` statement of the same name, so a change applied late
/// does what it would have done at once (nothing else writes between: every other transaction
/// applies the recorded changes first).
public enum StateChange: Sendable, Equatable {
    case upsert(InodeRecord)
    case deleteInode(UInt64)
    case insertEntry(parent: UInt64, name: [UInt8], ino: UInt64)
    case removeEntry(parent: UInt64, name: [UInt8])
    case moveEntry(parent: UInt64, name: [UInt8], toParent: UInt64, toName: [UInt8])
    case exchangeEntries(UInt64, [UInt8], UInt64, [UInt8])
    /// Queued for upload, not before `notBefore` (seconds since 1970, taken when recorded).
    case enqueue(UInt64, notBefore: Double)
    case setXattr(UInt64, name: [UInt8], value: [UInt8])
    case removeXattr(UInt64, name: [UInt8])
    case replaceXattrs(UInt64, [[UInt8]: [UInt8]])
    case removeDownload(UInt64)

    public func apply(_ tx: StateTransaction) throws {
        switch self {
        case .upsert(let r): try tx.upsert(r)
        case .deleteInode(let ino): try tx.deleteInode(ino)
        case .insertEntry(let parent, let name, let ino): try tx.insertEntry(parent: parent, name: name, ino: ino)
        case .removeEntry(let parent, let name): try tx.removeEntry(parent: parent, name: name)
        case .moveEntry(let p, let n, let tp, let tn): try tx.moveEntry(parent: p, name: n, toParent: tp, toName: tn)
        case .exchangeEntries(let ap, let an, let bp, let bn): try tx.exchangeEntries((ap, an), (bp, bn))
        case .enqueue(let ino, let notBefore): try tx.enqueue(ino, notBefore: notBefore)
        case .setXattr(let ino, let name, let value): try tx.setXattr(ino, name: name, value: value)
        case .removeXattr(let ino, let name): try tx.removeXattr(ino, name: name)
        case .replaceXattrs(let ino, let attrs): try tx.replaceXattrs(ino, attrs)
        case .removeDownload(let ino): try tx.removeDownload(ino)
        }
    }
}

/// The changes of one request, gathered by its body (`FileSystem.persist`) with the names the
/// statements have in `StateTransaction`.
public final class StateChanges {
    public private(set) var list: [StateChange] = []
    /// `now`: the time an upload's delay counts from (the state's time, `LocalState.time`).
    public init(now: Date) { self.now = now }
    let now: Date

    public func upsert(_ r: InodeRecord) { list.append(.upsert(r)) }
    public func deleteInode(_ ino: UInt64) { list.append(.deleteInode(ino)) }
    public func insertEntry(parent: UInt64, name: [UInt8], ino: UInt64) { list.append(.insertEntry(parent: parent, name: name, ino: ino)) }
    public func removeEntry(parent: UInt64, name: [UInt8]) { list.append(.removeEntry(parent: parent, name: name)) }
    public func moveEntry(parent: UInt64, name: [UInt8], toParent: UInt64, toName: [UInt8]) {
        list.append(.moveEntry(parent: parent, name: name, toParent: toParent, toName: toName))
    }
    public func exchangeEntries(_ a: (UInt64, [UInt8]), _ b: (UInt64, [UInt8])) { list.append(.exchangeEntries(a.0, a.1, b.0, b.1)) }
    public func enqueue(_ ino: UInt64, delay: TimeInterval = 0) {
        list.append(.enqueue(ino, notBefore: now.timeIntervalSince1970 + delay))
    }
    public func setXattr(_ ino: UInt64, name: [UInt8], value: [UInt8]) { list.append(.setXattr(ino, name: name, value: value)) }
    public func removeXattr(_ ino: UInt64, name: [UInt8]) { list.append(.removeXattr(ino, name: name)) }
    public func replaceXattrs(_ ino: UInt64, _ attrs: [[UInt8]: [UInt8]]) { list.append(.replaceXattrs(ino, attrs)) }
    public func removeDownload(_ ino: UInt64) { list.append(.removeDownload(ino)) }
    public func append(_ changes: [StateChange]) { list += changes }
}

// MARK: - The bytes of a change in the intent log

extension StateChange {
    func encode(to w: inout ByteWriter) {
        switch self {
        case .upsert(let r):
            w.u8(1); w.u64(r.ino); w.u32(r.type); w.u32(r.perm); w.u32(r.uid); w.u32(r.gid); w.i64(r.size)
            w.i64(r.atimeNs); w.i64(r.mtimeNs); w.i64(r.ctimeNs); w.u64(r.rdev); w.optionalBytes(r.target)
            w.bool(r.present); w.i64(r.contentGen); w.i64(r.metaGen); w.bool(r.pinned)
        case .deleteInode(let ino): w.u8(2); w.u64(ino)
        case .insertEntry(let parent, let name, let ino): w.u8(3); w.u64(parent); w.bytes(name); w.u64(ino)
        case .removeEntry(let parent, let name): w.u8(4); w.u64(parent); w.bytes(name)
        case .moveEntry(let p, let n, let tp, let tn): w.u8(5); w.u64(p); w.bytes(n); w.u64(tp); w.bytes(tn)
        case .exchangeEntries(let ap, let an, let bp, let bn): w.u8(6); w.u64(ap); w.bytes(an); w.u64(bp); w.bytes(bn)
        case .enqueue(let ino, let notBefore): w.u8(7); w.u64(ino); w.u64(notBefore.bitPattern)
        case .setXattr(let ino, let name, let value): w.u8(8); w.u64(ino); w.bytes(name); w.bytes(value)
        case .removeXattr(let ino, let name): w.u8(9); w.u64(ino); w.bytes(name)
        case .replaceXattrs(let ino, let attrs):
            w.u8(10); w.u64(ino); w.u32(UInt32(attrs.count))
            for (k, v) in attrs { w.bytes(k); w.bytes(v) }
        case .removeDownload(let ino): w.u8(11); w.u64(ino)
        }
    }

    static func decode(from r: inout ByteReader) throws -> StateChange {
        switch try r.u8() {
        case 1:
            var rec = InodeRecord(ino: try r.u64(), type: try r.u32(), perm: try r.u32(), uid: try r.u32(), gid: try r.u32(),
                                  size: try r.i64(), atimeNs: try r.i64(), mtimeNs: try r.i64(), ctimeNs: try r.i64(),
                                  rdev: try r.u64(), target: try r.optionalBytes(), present: try r.bool(),
                                  contentGen: try r.i64(), metaGen: try r.i64())
            rec.pinned = try r.bool()
            return .upsert(rec)
        case 2: return .deleteInode(try r.u64())
        case 3: return .insertEntry(parent: try r.u64(), name: try r.bytes(), ino: try r.u64())
        case 4: return .removeEntry(parent: try r.u64(), name: try r.bytes())
        case 5: return .moveEntry(parent: try r.u64(), name: try r.bytes(), toParent: try r.u64(), toName: try r.bytes())
        case 6: return .exchangeEntries(try r.u64(), try r.bytes(), try r.u64(), try r.bytes())
        case 7: return .enqueue(try r.u64(), notBefore: Double(bitPattern: try r.u64()))
        case 8: return .setXattr(try r.u64(), name: try r.bytes(), value: try r.bytes())
        case 9: return .removeXattr(try r.u64(), name: try r.bytes())
        case 10:
            let ino = try r.u64()
            let count = try r.u32()
            var attrs: [[UInt8]: [UInt8]] = [:]
            for _ in 0 ..< count { attrs[try r.bytes()] = try r.bytes() }
            return .replaceXattrs(ino, attrs)
        case 11: return .removeDownload(try r.u64())
        case let tag: throw ByteReader.Malformed(why: "unknown change \(tag)")
        }
    }
}

/// Little-endian fixed-width fields and length-prefixed bytes.
struct ByteWriter {
    var out: [UInt8] = []
    mutating func u8(_ v: UInt8) { out.append(v) }
    mutating func bool(_ v: Bool) { out.append(v ? 1 : 0) }
    mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
    mutating func u64(_ v: UInt64) { withUnsafeBytes(of: v.littleEndian) { out += $0 } }
    mutating func i64(_ v: Int64) { u64(UInt64(bitPattern: v)) }
    mutating func bytes(_ v: [UInt8]) { u32(UInt32(v.count)); out += v }
    mutating func optionalBytes(_ v: [UInt8]?) {
        if let v { bool(true); bytes(v) } else { bool(false) }
    }
}

struct ByteReader {
    struct Malformed: Error { var why: String }
    let data: [UInt8]
    var at: Int
    init(_ data: [UInt8], at: Int = 0) { self.data = data; self.at = at }

    private mutating func take(_ n: Int) throws -> ArraySlice<UInt8> {
        guard n >= 0, data.count - at >= n else { throw Malformed(why: "cut short") }
        defer { at += n }
        return data[at ..< at + n]
    }
    mutating func u8() throws -> UInt8 { try take(1).first! }
    mutating func bool() throws -> Bool {
        switch try u8() { case 0: return false; case 1: return true; default: throw Malformed(why: "not a boolean") }
    }
    mutating func u32() throws -> UInt32 { try take(4).reversed().reduce(0) { $0 << 8 | UInt32($1) } }
    mutating func u64() throws -> UInt64 { try take(8).reversed().reduce(0) { $0 << 8 | UInt64($1) } }
    mutating func i64() throws -> Int64 { Int64(bitPattern: try u64()) }
    mutating func bytes() throws -> [UInt8] { [UInt8](try take(Int(try u32()))) }
    mutating func optionalBytes() throws -> [UInt8]? { try bool() ? try bytes() : nil }
}
