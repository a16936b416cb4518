import Foundation

// Moves in the change log: a copy to a new key and the delete of its source, written as one
// item of a `move` entry (docs/s3.md), and read back as the delete and the put they stand for.
extension ChangeLog {
    /// A `move` entry: the keys `from` + each item's name, copied to `to` + the name and deleted.
    public struct Move: Codable {
        public var op = "move"
        public var from: String
        public var to: String
        public var items: [Item]

        /// One key moved, and what its put wrote (as a put's entry says it).
        public struct Item: Codable {
            public var name: String
            public var version: String?
            public var size: Int64? = nil
            public var tag: String? = nil
            public var meta: ObjectMetadata? = nil
            public var at: Int64? = nil

            init(name: String, _ put: Entry) {
                self.name = name; version = put.version; size = put.size; tag = put.tag; meta = put.meta; at = put.at
            }

            /// As an entry's: what it says it wrote is read only if it reads.
            public init(from decoder: any Decoder) throws {
                let c = try decoder.container(keyedBy: CodingKeys.self)
                name = try c.decode(String.self, forKey: .name)
                version = try c.decodeIfPresent(String.self, forKey: .version)
                size = try? c.decodeIfPresent(Int64.self, forKey: .size)
                tag = try? c.decodeIfPresent(String.self, forKey: .tag)
                meta = try? c.decodeIfPresent(ObjectMetadata.self, forKey: .meta)
                at = try? c.decodeIfPresent(Int64.self, forKey: .at)
            }

            /// The put of `key` it stands for.
            public func put(_ key: String) -> Entry {
                var e = Entry(op: "put", key: key, version: version)
                e.size = size; e.tag = tag; e.meta = meta; e.at = at
                return e
            }
        }

        /// How a move of `from` to `to` splits: `from` = P + name and `to` = Q + name, with the
        /// longest name that starts a segment in both (P and Q empty or ending in `/`): a
        /// folder's files and markers share one P and Q, a file renamed in place has its whole
        /// keys as P and Q and an empty name.
        public static func split(from: String, to: String) -> (from: String, to: String, name: String) {
            let f = Array(from.utf8), t = Array(to.utf8)
            let slash = UInt8(ascii: "/")
            var best = 0
            // Where a name may start in `from`: its beginning, and after each slash.
            for start in 0 ... f.count where start == 0 || f[start - 1] == slash {
                let n = f.count - start
                guard n > best, n <= t.count else { continue }
                let tStart = t.count - n
                guard tStart == 0 || t[tStart - 1] == slash, f[start...].elementsEqual(t[tStart...]) else { continue }
                // The same key both sides is no move (a name all of both keys).
                guard !(start == 0 && tStart == 0) else { continue }
                best = n
            }
            return (String(decoding: f[..<(f.count - best)], as: UTF8.self), String(decoding: t[..<(t.count - best)], as: UTF8.self),
                    String(decoding: f[(f.count - best)...], as: UTF8.self))
        }
    }

    /// The lines of one log object of `batch`: each entry's, but a copy and the delete of its
    /// source after it, which go as one item of a `move` entry (one for each pair of folders
    /// moved, where the first of its copies was).
    public static func lines(_ batch: [Entry]) throws -> Data {
        var copyAt: [String: Int] = [:]
        var pairedDelete = Set<Int>()
        var deleteOf: [Int: Int] = [:]
        for (i, e) in batch.enumerated() {
            if let from = e.from {
                copyAt[from] = i
            } else if e.op == "delete", let c = copyAt.removeValue(forKey: e.key) {
                pairedDelete.insert(i)
                deleteOf[c] = i
            }
        }
        enum Line { case entry(Entry), move(Int) }
        var order: [Line] = []
        var moves: [Move] = []
        var moveIndex: [String: Int] = [:]
        for (i, e) in batch.enumerated() where !pairedDelete.contains(i) {
            guard let from = e.from, deleteOf[i] != nil else {
                order.append(.entry(e)); continue
            }
            let (p, q, name) = Move.split(from: from, to: e.key)
            let id = p + "\u{0}" + q
            if let m = moveIndex[id] {
                moves[m].items.append(.init(name: name, e))
            } else {
                moveIndex[id] = moves.count
                order.append(.move(moves.count))
                moves.append(Move(from: p, to: q, items: [.init(name: name, e)]))
            }
        }
        var body = Data()
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        for line in order {
            switch line {
            case .entry(let e): body.append(try encoder.encode(e))
            case .move(let m): body.append(try encoder.encode(moves[m]))
            }
            body.append(0x0A)
        }
        return body
    }

    /// A `move` entry's changes: for each item, the delete of its old key and the put of its new
    /// one, side by side (the feed pairs them as a move). An item whose keys are not both good
    /// is passed over, both halves.
    public func take(_ m: Move, of name: String, line: Int, mine: Bool, into out: inout Read) {
        for item in m.items {
            let old = m.from + item.name, new = m.to + item.name
            do {
                try validate(old)
                try validate(new)
                guard old != new else { throw StoreError.invalidKey(new, reason: "moved onto itself") }
            } catch {
                out.unreadable.add("log object \(name), line \(line): a move's item: \(error)"); continue
            }
            let put = item.put(new)
            out.changes.append(StoreChange(kind: .delete, key: old, version: nil))
            out.notes.append(Note(at: item.at, mine: mine))
            out.changes.append(StoreChange(kind: .put, key: new, version: put.version, claimed: put.claimed))
            out.notes.append(Note(at: item.at, mine: mine))
        }
    }
}
