import Foundation
import UbiqClock
import Synchronization
import UbiqState
import UbiqStore
import UbiqSync

/// Something that happened to an item, for `ubiq watch` and `ubiq query --watch`
/// (NSFilePresenter's notifications, as a stream).
public struct ItemEvent: Sendable, Equatable {
    public enum Kind: String, Sendable {
        /// Created or changed on this device.
        case changed
        /// Added or changed by another device (arrived through the change feed).
        case changedRemotely = "changed-remotely"
        /// Its sync status moved on (uploaded, downloaded, an error).
        case status
        /// Two devices changed one item: `copy` is the conflict copy beside it (announced when
        /// the copy arrives, on every device), or nil where none was made (a folder's change
        /// refused: kept here, status `conflict`).
        case conflict
        case deleted
        /// Renamed or moved; `from` is where it was.
        case moved
    }
    public var kind: Kind
    /// The path inside the mount (empty for the root): the names' own bytes joined with "/".
    public var pathBytes: [UInt8]
    /// Where it was (`moved`).
    public var fromBytes: [UInt8]?
    /// The conflict copy beside it (`conflict`).
    public var copyBytes: [UInt8]?
    public var ino: UInt64
    public var time: Date

    public init(kind: Kind, pathBytes: [UInt8], fromBytes: [UInt8]? = nil, copyBytes: [UInt8]? = nil, ino: UInt64, time: Date) {
        self.kind = kind; self.pathBytes = pathBytes; self.fromBytes = fromBytes; self.copyBytes = copyBytes
        self.ino = ino; self.time = time
    }

    /// The path as text (U+FFFD for bytes that are not UTF-8).
    public var path: String { String(decoding: pathBytes, as: UTF8.self) }
    public var from: String? { fromBytes.map { String(decoding: $0, as: UTF8.self) } }
}

/// Fans events out to subscribers; each has a bounded queue of its own (a slow reader
/// loses the oldest events, and is told how many).
public final class EventBus: @unchecked Sendable {
    public final class Subscription: @unchecked Sendable {
        let cond = NSCondition()
        var queue: [ItemEvent] = []
        var dropped = 0
        var closed = false
        let limit: Int
        /// The kinds it hears (nil: all).
        let kinds: Set<ItemEvent.Kind>?
        init(limit: Int, kinds: Set<ItemEvent.Kind>?) { self.limit = limit; self.kinds = kinds }
        func wants(_ kind: ItemEvent.Kind) -> Bool { kinds?.contains(kind) ?? true }

        /// Waits up to `timeout` for events; returns them (and how many were lost), or nil once closed.
        public func next(timeout: TimeInterval) -> (events: [ItemEvent], dropped: Int)? {
            cond.lock(); defer { cond.unlock() }
            let deadline = Deadline(in: timeout)
            while queue.isEmpty && !closed && !deadline.passed { deadline.wait(cond) }
            if closed && queue.isEmpty { return nil }
            defer { queue.removeAll(); dropped = 0 }
            return (queue, dropped)
        }

        func push(_ e: ItemEvent) {
            cond.lock()
            if queue.count >= limit { queue.removeFirst(); dropped += 1 }
            queue.append(e)
            cond.signal()
            cond.unlock()
        }

        func close() { cond.lock(); closed = true; cond.broadcast(); cond.unlock() }
    }

    private let subscribers = Mutex<[ObjectIdentifier: Subscription]>([:])

    public init() {}

    /// Whether anyone hears events of `kind`: nothing is computed for one nobody hears (a
    /// desktop's conflict notifier, always there, hears conflicts only: every write's path
    /// would otherwise be looked up for it).
    public func wants(_ kind: ItemEvent.Kind) -> Bool { subscribers.withLock { $0.values.contains { $0.wants(kind) } } }

    /// A subscription to events of `kinds` (nil: all).
    public func subscribe(limit: Int = 10_000, kinds: Set<ItemEvent.Kind>? = nil) -> Subscription {
        let s = Subscription(limit: limit, kinds: kinds)
        subscribers.withLock { $0[ObjectIdentifier(s)] = s }
        return s
    }

    public func unsubscribe(_ s: Subscription) {
        subscribers.withLock { $0[ObjectIdentifier(s)] = nil }
        s.close()
    }

    func publish(_ e: ItemEvent) {
        for s in subscribers.withLock({ Array($0.values) }) where s.wants(e.kind) { s.push(e) }
    }
}

extension FileSystem {
    /// The path of `ino` inside the mount (its first name), or nil when it has none, as text
    /// (U+FFFD for bytes that are not UTF-8: `pathBytes(of:)` has them).
    public func path(of ino: UInt64) -> String? {
        pathBytes(of: ino).map { String(decoding: $0, as: UTF8.self) }
    }

    /// The path of `ino` inside the mount, its names' own bytes joined with "/".
    public func pathBytes(of ino: UInt64) -> [UInt8]? {
        if ino == rootIno { return [] }
        let isDir = inodes.locked { t in t[ino]?.isDirectory }
        guard let isDir else { return nil }
        if !isDir {
            // A file: its entry tells the folder it is in.
            guard let e = try? state.read({ try $0.entries(of: ino).first }), let dir = pathBytes(of: e.parent) else { return nil }
            return Self.join(dir, e.name)
        }
        // Folders know their parent.
        let names: [[UInt8]]? = inodes.locked { t in
            var out: [[UInt8]] = []
            var cur = ino
            var depth = 0
            while cur != rootIno && depth < 4096 {
                guard let n = t[cur], let parent = t[n.parent],
                      let name = parent.children.first(where: { $0.value == cur })?.key else { return nil }
                out.append(name)
                cur = n.parent
                depth += 1
            }
            return out.reversed()
        }
        return names.map { Array($0.joined(separator: [UInt8(ascii: "/")])) }
    }

    /// Publishes an event about `ino` (nothing is computed when nobody listens).
    func emit(_ kind: ItemEvent.Kind, _ ino: UInt64, path known: [UInt8]? = nil, from: [UInt8]? = nil, copy: [UInt8]? = nil) {
        guard events.wants(kind) else { return }
        guard let p = known ?? pathBytes(of: ino) else { return }
        events.publish(ItemEvent(kind: kind, pathBytes: p, fromBytes: from, copyBytes: copy, ino: ino, time: state.time.now))
    }

    /// A new item of the store, `name` in folder `dir`, that is a conflict copy (made by a
    /// device's upload that met another's version: `Uploader.keepAsConflictCopy`): the item it
    /// was made for is announced as in conflict, with both names.
    func announceIfConflictCopy(in dir: UInt64, name: [UInt8], _ meta: ObjectMetadata) {
        guard events.wants(.conflict), meta.origin?.hasPrefix("conflict-copy:") == true,
              let text = String(validating: name, as: UTF8.self), let target = ConflictName.target(of: text),
              let item = inodes.locked({ t in t[dir]?.children[Array(target.utf8)] }),
              let folder = pathBytes(of: dir) else { return }
        emit(.conflict, item, path: Self.join(folder, Array(target.utf8)), copy: Self.join(folder, name))
    }
}
