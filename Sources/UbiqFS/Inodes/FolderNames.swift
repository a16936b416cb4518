import Glibc

/// A folder's names, each to its inode, kept compactly: every folder is in memory with its
/// names (docs/architecture.md, "Inodes in memory"), so at a million items these are most of
/// the daemon's memory.
///
/// A `[[UInt8]: UInt64]` costs about 92 bytes a name (an array of its own for each name, and
/// the dictionary's slack); here the names lie end to end in one buffer, each entry is 16
/// bytes (where its name starts, its length, its inode), and an open-addressing index of
/// 4-byte slots finds an entry by its name's hash: about 40 bytes a name of 13 bytes
/// (docs/scale.md). Hashes are seeded per run (`Hasher`), so names a store chose cannot be
/// made to collide. Order is not kept (as a dictionary's is not); removing an entry moves the
/// last one into its place.
struct FolderNames: Sequence {
    private struct Entry {
        var offset: UInt32
        var length: UInt32
        var ino: UInt64
    }

    /// The names, end to end; those of removed entries stay until `compact`.
    private var bytes: [UInt8] = []
    private var entries: [Entry] = []
    /// Linear probing; a slot holds an index into `entries` plus one (0: empty). Its count is
    /// zero or a power of two, at least a third larger than `entries`.
    private var slots: [UInt32] = []
    /// Bytes in `bytes` that no entry names.
    private var garbage = 0

    init() {}

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }

    /// The inode under `name`; set nil to remove the name.
    subscript(name: [UInt8]) -> UInt64? {
        get {
            guard let e = find(name).entry else { return nil }
            return entries[e].ino
        }
        set {
            if let ino = newValue { insert(name, ino) } else { remove(name) }
        }
    }

    /// The inodes, in no order.
    var values: some Sequence<UInt64> { entries.lazy.map(\.ino) }
    /// The names, in no order.
    var keys: some Sequence<[UInt8]> { lazy.map(\.key) }

    struct Iterator: IteratorProtocol {
        fileprivate let names: FolderNames
        fileprivate var position = 0
        mutating func next() -> (key: [UInt8], value: UInt64)? {
            guard position < names.entries.count else { return nil }
            defer { position += 1 }
            let e = names.entries[position]
            return (names.name(of: e), e.ino)
        }
    }
    func makeIterator() -> Iterator { Iterator(names: self) }
    var underestimatedCount: Int { entries.count }

    // MARK: Inside

    private func name(of e: Entry) -> [UInt8] {
        Array(bytes[Int(e.offset) ..< Int(e.offset) + Int(e.length)])
    }

    private static func hash(_ name: UnsafeRawBufferPointer) -> Int {
        var h = Hasher()
        h.combine(bytes: name)
        return h.finalize()
    }

    private func hash(of e: Entry) -> Int {
        bytes.withUnsafeBytes { Self.hash(UnsafeRawBufferPointer(rebasing: $0[Int(e.offset) ..< Int(e.offset) + Int(e.length)])) }
    }

    private func matches(_ e: Entry, _ name: UnsafeRawBufferPointer) -> Bool {
        guard Int(e.length) == name.count else { return false }
        return bytes.withUnsafeBytes { all in
            name.isEmpty || memcmp(all.baseAddress! + Int(e.offset), name.baseAddress!, name.count) == 0
        }
    }

    /// The slot where `name` is, or the empty one where it would go; and its entry if there.
    private func find(_ name: [UInt8]) -> (slot: Int, entry: Int?) {
        guard !slots.isEmpty else { return (0, nil) }
        return name.withUnsafeBytes { name in
            let mask = slots.count - 1
            var s = Self.hash(name) & mask
            while true {
                let v = slots[s]
                if v == 0 { return (s, nil) }
                if matches(entries[Int(v) - 1], name) { return (s, Int(v) - 1) }
                s = (s + 1) & mask
            }
        }
    }

    private mutating func insert(_ name: [UInt8], _ ino: UInt64) {
        var (slot, found) = find(name)
        if let e = found {
            entries[e].ino = ino
            return
        }
        if (entries.count + 1) * 4 > slots.count * 3 {
            rebuildSlots(capacity: Swift.max(8, slots.count * 2))
            slot = find(name).slot
        }
        entries.append(Entry(offset: UInt32(bytes.count), length: UInt32(name.count), ino: ino))
        bytes.append(contentsOf: name)
        slots[slot] = UInt32(entries.count)
    }

    private mutating func remove(_ name: [UInt8]) {
        let (slot, found) = find(name)
        guard let e = found else { return }
        vacate(slot)
        garbage += Int(entries[e].length)
        let last = entries.count - 1
        if e != last {
            // The last entry takes the removed one's place: its slot says so.
            let mask = slots.count - 1
            var s = hash(of: entries[last]) & mask
            while slots[s] != UInt32(last + 1) { s = (s + 1) & mask }
            slots[s] = UInt32(e + 1)
            entries[e] = entries[last]
        }
        entries.removeLast()
        if entries.isEmpty {
            self = FolderNames()
        } else if garbage > 4096 && garbage * 2 > bytes.count || entries.count * 8 < slots.count && slots.count > 8 {
            compact()
        }
    }

    /// Empties `slot`, moving later entries of its run back so that every one stays reachable
    /// from its home slot (deletion without tombstones).
    private mutating func vacate(_ slot: Int) {
        let mask = slots.count - 1
        var hole = slot
        var s = slot
        while true {
            s = (s + 1) & mask
            let v = slots[s]
            if v == 0 { break }
            let home = hash(of: entries[Int(v) - 1]) & mask
            // It stays where it is if its home lies cyclically in (hole, s].
            let stays = hole <= s ? (hole < home && home <= s) : (hole < home || home <= s)
            if stays { continue }
            slots[hole] = v
            hole = s
        }
        slots[hole] = 0
    }

    private mutating func rebuildSlots(capacity: Int) {
        slots = [UInt32](repeating: 0, count: capacity)
        let mask = capacity - 1
        for (i, e) in entries.enumerated() {
            var s = hash(of: e) & mask
            while slots[s] != 0 { s = (s + 1) & mask }
            slots[s] = UInt32(i + 1)
        }
    }

    /// Writes the names again without the removed ones' bytes, in buffers of the size needed.
    private mutating func compact() {
        var packed: [UInt8] = []
        packed.reserveCapacity(bytes.count - garbage)
        var kept: [Entry] = []
        kept.reserveCapacity(entries.count)
        for e in entries {
            kept.append(Entry(offset: UInt32(packed.count), length: e.length, ino: e.ino))
            packed.append(contentsOf: bytes[Int(e.offset) ..< Int(e.offset) + Int(e.length)])
        }
        bytes = packed
        entries = kept
        garbage = 0
        var capacity = 8
        while capacity * 3 < entries.count * 4 + 4 { capacity *= 2 }
        rebuildSlots(capacity: capacity)
    }
}
