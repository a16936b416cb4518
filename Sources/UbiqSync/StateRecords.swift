import UbiqState
import UbiqStore

extension StateTransaction {
    /// Records that entry `entryID`'s object sits at `key` as the store describes it in `info`:
    /// its version, content tag, digest and item id together (see `recordRemote(entryID:key:version:tag:digest:)`).
    public func recordRemote(entryID: Int64, key: String, _ info: ObjectInfo) throws {
        try recordRemote(entryID: entryID, key: key, version: info.version, tag: info.contentTag, digest: info.metadata.sha256,
                         fileID: info.metadata.fileID)
    }
}

extension EntryRecord {
    /// Whether the version this entry records holds the bytes of `info`: the same digest when
    /// both have one (a copy keeps its source's), else the same content tag.
    public func holdsTheBytes(of info: ObjectInfo) -> Bool {
        if let mine = remoteDigest, let theirs = info.metadata.sha256 { return mine == theirs }
        if let mine = remoteTag, let theirs = info.contentTag { return mine == theirs }
        return false
    }
}

extension ObjectInfo {
    /// Whether this is a file with bytes, which a move elsewhere can carry (see `RemoteApplier.applyRemote`).
    public var isFileWithBytes: Bool { metadata.kind == .file && size > 0 && !key.hasSuffix("/") }
}
