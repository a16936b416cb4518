import Foundation

/// The part of a store under one prefix, as a store of its own: keys go in with the prefix and
/// come out without it; nothing outside it is seen. A container is this over its folder.
public final class PrefixStore: StoreDecorator, Sendable {
    public let inner: any CloudStore
    /// Ends in "/".
    public let prefix: String

    public init(_ inner: any CloudStore, prefix: String) {
        self.inner = inner
        self.prefix = prefix.hasSuffix("/") ? prefix : prefix + "/"
    }

    func outer(_ key: String) throws -> String {
        try StoreKey.validate(key)
        return prefix + key
    }

    func local(_ info: ObjectInfo) -> ObjectInfo {
        var i = info
        i.key = String(info.key.dropFirst(prefix.count))
        return i
    }

    func local(_ c: StoreChange) -> StoreChange {
        var current = c.current
        if case .object(let info) = current { current = .object(local(info)) }
        return StoreChange(kind: c.kind, key: String(c.key.dropFirst(prefix.count)), version: c.version,
                           claimed: c.claimed.map(local), current: current)
    }

    /// Errors name keys as this store knows them.
    func rename(_ error: Error) -> Error {
        switch error {
        case StoreError.notFound(let k) where k.hasPrefix(prefix): return StoreError.notFound(key: String(k.dropFirst(prefix.count)))
        case StoreError.preconditionFailed(let k, let cur) where k.hasPrefix(prefix):
            return StoreError.preconditionFailed(key: String(k.dropFirst(prefix.count)), current: cur)
        case StoreError.quotaExceeded(let k) where k.hasPrefix(prefix): return StoreError.quotaExceeded(key: String(k.dropFirst(prefix.count)))
        default: return error
        }
    }

    func mapped<T>(_ body: () async throws -> T) async throws -> T {
        do { return try await body() } catch { throw rename(error) }
    }

    public func head(_ key: String) async throws -> ObjectInfo {
        let k = try outer(key)
        return local(try await mapped { try await inner.head(k) })
    }

    public func list(prefix p: String) async throws -> [ObjectInfo] {
        try await inner.list(prefix: prefix + p).filter { $0.key.count > prefix.count }.map(local)
    }

    public func list(prefix p: String, pagesOf size: Int, wanted: ([String]) throws -> [Bool],
                     _ body: ([ObjectInfo]) throws -> Void) async throws {
        try await inner.list(prefix: prefix + p, pagesOf: size, wanted: { keys in
            // The prefix's own marker is not an object of this store: neither asked nor wanted.
            let inside = keys.indices.filter { keys[$0].count > prefix.count }
            let asked = try wanted(inside.map { String(keys[$0].dropFirst(prefix.count)) })
            var mask = [Bool](repeating: false, count: keys.count)
            for (i, w) in zip(inside, asked) { mask[i] = w }
            return mask
        }) { page in
            try body(page.filter { $0.key.count > prefix.count }.map(local))
        }
    }

    public func read(_ key: String, version: String, range: Range<Int64>) async throws -> Data {
        let k = try outer(key)
        return try await mapped { try await inner.read(k, version: version, range: range) }
    }

    public func read(_ key: String, version: String, range: Range<Int64>, into fd: Int32, at offset: Int64) async throws -> Int64 {
        let k = try outer(key)
        return try await mapped { try await inner.read(k, version: version, range: range, into: fd, at: offset) }
    }

    public func put(_ key: String, contentsOf source: URL?, metadata: ObjectMetadata, condition: WriteCondition,
                    progress: (@Sendable (Int64) -> Void)?) async throws -> ObjectInfo {
        let k = try outer(key)
        return local(try await mapped { try await inner.put(k, contentsOf: source, metadata: metadata, condition: condition, progress: progress) })
    }

    public func copy(from source: String, version: String, to destination: String, metadata: ObjectMetadata?,
                     condition: WriteCondition) async throws -> ObjectInfo {
        let s = try outer(source), d = try outer(destination)
        return local(try await mapped { try await inner.copy(from: s, version: version, to: d, metadata: metadata, condition: condition) })
    }

    public func delete(_ key: String, condition: WriteCondition) async throws {
        let k = try outer(key)
        try await mapped { try await inner.delete(k, condition: condition) }
    }

    public func deleteMoved(_ key: String, version: String, to destination: String) async throws {
        let (k, d) = (try outer(key), try outer(destination))
        try await mapped { try await inner.deleteMoved(k, version: version, to: d) }
    }

    /// The inner store's changes under the prefix (the cursor is the inner store's).
    public func changes(since cursor: String?, limit: Int) async throws -> ChangeBatch {
        var batch = try await inner.changes(since: cursor, limit: limit)
        batch.changes = batch.changes.filter { $0.key.hasPrefix(prefix) && $0.key.count > prefix.count }.map(local)
        // Paging follows the inner feed: a full page of others' changes still means "more".
        return batch
    }

    /// Not the inner store's `startingCursor(listingFirst:)`: its first part is of the whole
    /// bucket, not of this prefix (the current cursor lists it whole).
    public func startingCursor(listingFirst objects: Int) async throws -> String { try await currentCursor() }

    public func versions(of key: String) async throws -> [ObjectInfo] {
        let k = try outer(key)
        return try await mapped { try await inner.versions(of: k) }.map(local)
    }

    /// The inner store's answer, its keys in and out of the prefix.
    public func confirmed(_ changes: [StoreChange]) async -> [StoreChange] {
        let inside = changes.map { c in
            let within = { [prefix] (i: ObjectInfo) -> ObjectInfo in var i = i; i.key = prefix + i.key; return i }
            var current = c.current
            if case .object(let info) = current { current = .object(within(info)) }
            // What the store told already goes back in with it (a full listing's known keys).
            return StoreChange(kind: c.kind, key: prefix + c.key, version: c.version, claimed: c.claimed.map(within), current: current)
        }
        return await inner.confirmed(inside).map(local)
    }
}
