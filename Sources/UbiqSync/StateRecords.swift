import UbiqState
import UbiqStore

extension StateTransaction {
    /// Records that entry `entryID`'s object sits at `key` as the store describes it in `info`:
    /// its version, content tag and digest together (see `recordRemote(entryID:key:version:tag:digest:)`).
    public func recordRemote(entryID: Int64, key: String, _ info: ObjectInfo) throws {
        try recordRemote(entryID: entryID, key: key, version: info.version, tag: info.contentTag, digest: info.metadata.sha256)
    }
}
