import ArgumentParser
import Foundation
import UbiqStore
import UbiqSync

/// What is wrong with a state directory's database, if its cache holds content it would
/// strand: nil when the directory can be mounted. A database that is missing, empty (after a
/// disk error, say) or not SQLite's, beside cached files, is refused: opened, it would start
/// a new, empty device and the cached edits would be lost from sight.
enum StateCheck {
    static func unusableDatabase(in stateDir: String) -> String? {
        let db = stateDir + "/state.db"
        let cached = cachedFiles(in: stateDir)
        if cached.isEmpty { return nil }
        var st = stat()
        guard stat(db, &st) == 0 else { return "state.db is missing" }
        if st.st_size == 0 { return "state.db is empty" }
        let fd = open(db, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }  // unreadable: the open says why
        defer { close(fd) }
        var head = [UInt8](repeating: 0, count: 16)
        let n = read(fd, &head, 16)
        if n < 16 || head != Array("SQLite format 3\0".utf8) { return "state.db is not a database (damaged)" }
        return nil
    }

    /// The content cache's files: `cache/<inode>`.
    static func cachedFiles(in stateDir: String) -> [String] {
        let dir = stateDir + "/cache"
        return ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? [])
            .filter { !$0.isEmpty && $0.allSatisfy(\.isNumber) }
            .sorted { (UInt64($0) ?? 0) < (UInt64($1) ?? 0) }
            .map { dir + "/" + $0 }
    }
}

struct Recover: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy the edits out of a state directory whose database is lost.",
        discussion: prose("""
            A state directory whose state.db is missing, empty or damaged cannot be mounted: its
            content cache may hold edits that never reached the store, and the names were in the
            database. This copies every cached file whose bytes the store does not hold to DEST,
            as recovered-<inode> with its time kept; files the store holds are named and skipped.
            Then move the state directory away and mount with a new one.

            Example:
              ubiq recover --state ~/.local/state/ubiq/abcd --store dir:/srv/team ~/recovered
            """))

    @Option(help: "The state directory to recover from.", completion: .directory)
    var state: String

    /// The store the device synced with: files whose bytes it holds are skipped.
    @OptionGroup var target: StoreOptions

    @Argument(help: "Where to copy the edits (made if missing; must not hold recovered-* files).", completion: .directory)
    var destination: String

    func run() throws {
        let stateDir = Paths.absolute(state)
        if StateLock.isHeld(stateDir) == true { fail("state directory \(stateDir) is in use by a running daemon") }
        let files = StateCheck.cachedFiles(in: stateDir)
        if files.isEmpty { fail("no cached files in \(stateDir)/cache: nothing to recover") }
        if StateCheck.unusableDatabase(in: stateDir) == nil {
            fail("\(stateDir)/state.db is usable: mount with --state \(stateDir), and its edits upload")
        }
        // Each cached file's digest, then the store's listing a page at a time for objects
        // with those bytes (safe there): what is held is the cache's digests, not the store's
        // listing (a million objects).
        var digests: [String: String] = [:]
        for path in files {
            do { digests[path] = try ContentDigest.of(path: path) } catch { fail("\(error)") }
        }
        let wanted = Set(digests.values)
        let inStore = UncheckedBox([String: String]())
        let s = target.open()
        do {
            try runBlocking {
                try await s.list(prefix: "", pagesOf: 10_000) { page in
                    for o in page { if let d = o.metadata.sha256, wanted.contains(d) { inStore.value[d] = o.key } }
                }
            }
        } catch {
            fail("cannot list the store \(target.store): \(error)")
        }
        let dest = Paths.absolute(destination)
        do { try FileManager.default.createDirectory(atPath: dest, withIntermediateDirectories: true) } catch {
            fail("cannot make \(dest): \(error.localizedDescription)")
        }
        var copied = 0, skipped = 0
        for path in files {
            let ino = (path as NSString).lastPathComponent
            if let key = digests[path].flatMap({ inStore.value[$0] }) {
                print("in the store: inode \(ino) is \(key)")
                skipped += 1
                continue
            }
            let out = dest + "/recovered-" + ino
            if FileManager.default.fileExists(atPath: out) { fail("\(out) exists: give an empty destination") }
            do { try FileManager.default.copyItem(atPath: path, toPath: out) } catch {
                fail("cannot copy \(path) to \(out): \(error.localizedDescription)")
            }
            var st = stat()
            if stat(path, &st) == 0 {
                var times = [st.st_atim, st.st_mtim]
                utimensat(AT_FDCWD, out, &times, 0)
            }
            print("recovered: \(out) (\(humanBytes(Int64(st.st_size))))")
            copied += 1
        }
        print("\(copied) files recovered to \(dest), \(skipped) already in the store")
    }
}
