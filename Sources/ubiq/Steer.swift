import ArgumentParser
import CUbiq
import Foundation

/// The paths given, resolved, each checked to be inside a ubiq mount.
func pathsInMounts(_ paths: [String]) -> [String] {
    paths.map { p in
        let abs = Paths.absolute(p)
        guard FileManager.default.fileExists(atPath: abs) else { fail("\(p): no such file or directory") }
        guard Mounts.ubiqMount(containing: abs) != nil else { fail("\(p) is not in a ubiq mount") }
        return abs
    }
}

/// Every regular file at or under `path`.
func files(under path: String) -> [String] {
    var isDir: ObjCBool = false
    guard FileManager.default.fileExists(atPath: path, isDirectory: &isDir) else { return [] }
    if !isDir.boolValue { return [path] }
    var out: [String] = []
    let e = FileManager.default.enumerator(atPath: path)
    while let rel = e?.nextObject() as? String {
        let full = path + "/" + rel
        var st = stat()
        if lstat(full, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG { out.append(full) }
    }
    return out.sorted()
}

func setAttribute(_ path: String, _ name: String, _ value: String) -> Int32 {
    let r = value.withCString { v in cubiq_setxattr(path, name, v, strlen(v)) }
    return r == 0 ? 0 : cubiq_errno()
}

struct Download: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Download files, or everything under folders, so they are here offline.",
        discussion: """
            Without --wait the downloads run in the background and the command returns at once.

            Examples:
              ubiq download ~/Ubiquity/Photos
              ubiq download --wait ~/Ubiquity/report.pdf
            """)

    @Flag(help: "Wait until every file is downloaded.")
    var wait = false

    @Argument(help: "Files or folders in a ubiq mount.")
    var paths: [String]

    func run() throws {
        var failed = 0
        for root in pathsInMounts(paths) {
            for f in files(under: root) {
                if wait {
                    // Reading through the mount is what downloads: it streams, and returns when all is here.
                    guard let h = FileHandle(forReadingAtPath: f) else { print("ubiq: cannot open \(f)"); failed += 1; continue }
                    var total = 0
                    do {
                        while let d = try h.read(upToCount: 1 << 20), !d.isEmpty { total += d.count }
                        print("downloaded \(f) (\(total) bytes)")
                    } catch {
                        FileHandle.standardError.write(Data("ubiq: cannot download \(f): \(error.localizedDescription)\n".utf8))
                        failed += 1
                    }
                    try? h.close()
                } else {
                    let e = setAttribute(f, "user.ubiq.action", "download")
                    if e != 0 {
                        FileHandle.standardError.write(Data("ubiq: cannot download \(f): \(String(cString: strerror(e)))\n".utf8))
                        failed += 1
                    } else {
                        print("downloading \(f)")
                    }
                }
            }
        }
        if failed > 0 { throw ExitCode.failure }
    }
}

struct Sync: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Bring in other devices' changes now, and start pending uploads.",
        discussion: """
            The mount also looks for changes on its own, every few seconds (mount --poll-interval).

            Example:
              ubiq sync ~/Ubiquity
            """)

    @Argument(help: "A path in a ubiq mount (the whole mount is synced).")
    var path: String

    func run() throws {
        guard let p = pathsInMounts([path]).first else { return }
        let e = setAttribute(p, "user.ubiq.action", "sync")
        if e != 0 { fail("cannot sync \(path): \(e == EIO ? "the store could not be reached" : String(cString: strerror(e)))") }
        print("synced \(Mounts.ubiqMount(containing: p) ?? p)")
    }
}

struct Evict: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Free the local space of files (or of everything under folders); they stay visible.",
        discussion: """
            Evicted files become placeholders again: listed with their true size, downloaded when opened.
            Refused, and named, losing nothing: files that are open, files whose changes are not yet in
            the store, and pinned files.

            Examples:
              ubiq evict ~/Ubiquity/Videos
            """)

    @Argument(help: "Files or folders in a ubiq mount.")
    var paths: [String]

    func run() throws {
        var refused = 0
        var evicted = 0
        for root in pathsInMounts(paths) {
            for f in files(under: root) {
                let e = setAttribute(f, "user.ubiq.action", "evict")
                switch e {
                case 0: evicted += 1
                case EBUSY: print("ubiq: not evicted: \(f): open, or still downloading"); refused += 1
                case EAGAIN: print("ubiq: not evicted: \(f): changes not yet uploaded"); refused += 1
                case EPERM: print("ubiq: not evicted: \(f): pinned (keep downloaded)"); refused += 1
                default: print("ubiq: not evicted: \(f): \(String(cString: strerror(e)))"); refused += 1
                }
            }
        }
        print("evicted \(evicted) files" + (refused > 0 ? ", \(refused) refused" : ""))
        if refused > 0 { throw ExitCode.failure }
    }
}

struct Pin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Keep files or folders downloaded: fetched now, never evicted.",
        discussion: """
            Pinning a folder covers everything under it, including what is added later.

            Examples:
              ubiq pin ~/Ubiquity/Documents
            """)

    @Argument(help: "Files or folders in a ubiq mount.")
    var paths: [String]

    func run() throws { try setPinned(paths, true) }
}

struct Unpin: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Stop keeping files or folders downloaded (they stay until evicted).",
        discussion: "Example: ubiq unpin ~/Ubiquity/Documents")

    @Argument(help: "Files or folders in a ubiq mount.")
    var paths: [String]

    func run() throws { try setPinned(paths, false) }
}

func setPinned(_ paths: [String], _ on: Bool) throws {
    var failed = 0
    for p in pathsInMounts(paths) {
        let e = setAttribute(p, "user.ubiq.pinned", on ? "1" : "0")
        if e != 0 {
            FileHandle.standardError.write(Data("ubiq: cannot \(on ? "pin" : "unpin") \(p): \(String(cString: strerror(e)))\n".utf8))
            failed += 1
        } else {
            print("\(on ? "pinned" : "unpinned") \(p)")
        }
    }
    if failed > 0 { throw ExitCode.failure }
}
