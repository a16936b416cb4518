import ArgumentParser
import Foundation
import UbiqControl
import UbiqSync

/// One conflict copy beside a file, as `ubiq versions` lists it.
struct ConflictCopy {
    var name: String
    var path: String
    var device: String
    var date: String
    var size: Int64
    var version: String
}

/// The conflict copies beside the file at `path` (read through the mount: names and attributes).
func conflictCopies(of path: String) -> [ConflictCopy] {
    let folder = (path as NSString).deletingLastPathComponent
    let name = (path as NSString).lastPathComponent
    let names = (try? FileManager.default.contentsOfDirectory(atPath: folder)) ?? []
    return names.filter { ConflictName.target(of: $0) == name }.sorted().map { copy in
        let full = folder + "/" + copy
        var st = stat()
        let size = lstat(full, &st) == 0 ? Int64(st.st_size) : 0
        let origin = ConflictName.origin(of: copy)
        return ConflictCopy(name: copy, path: full, device: origin?.device ?? "", date: origin?.date ?? "", size: size,
                            version: getAttribute(full, "user.ubiq.version") ?? "")
    }
}

/// A file in a mount, for the commands on one file's versions.
func fileInMount(_ path: String) -> String {
    guard let p = pathsInMounts([path]).first else { fail("\(path): no such file") }
    var st = stat()
    guard lstat(p, &st) == 0 else { fail("\(path): \(String(cString: strerror(errno)))") }
    if (st.st_mode & S_IFMT) == S_IFDIR { fail("\(path) is a folder: versions are kept per file") }
    return p
}

struct Versions: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List a file's current version and the conflict copies beside it (--all: its history too).",
        discussion: prose("""
            When two devices change a file at once, both versions are kept: the file keeps one, and
            the other sits beside it as "NAME (conflict DEVICE DATE).EXT", on every device, until
            `ubiq resolve` settles it (docs/sync.md).

            With --all, also every version the store keeps of the file (newest first); `ubiq restore`
            brings one back.

            --json prints one object ("history" only with --all), with these keys:
              {"path", "size", "version", "status",
               "conflicts": [{"name", "path", "device", "date", "size", "version"}],
               "history": [{"version", "size", "mtime", "device", "current"}]}

            Examples:
              ubiq versions ~/Ubiquity/plan.txt
              ubiq versions --all --json ~/Ubiquity/plan.txt
            """))

    @Flag(help: "Also list the versions the store keeps of the file.")
    var all = false

    @Flag(help: "One JSON object.")
    var json = false

    @Argument(help: "A file in a ubiq mount.", completion: .file())
    var path: String

    func run() throws {
        let p = fileInMount(path)
        var st = stat()
        _ = lstat(p, &st)
        let copies = conflictCopies(of: p)
        let version = getAttribute(p, "user.ubiq.version") ?? ""
        let status = getAttribute(p, "user.ubiq.status") ?? ""
        var history: [HistoryReply.Version] = []
        if all {
            let client = ControlClient.connect(for: p)
            defer { client.close() }
            history = client.request(.history(path: client.relative(p)), as: HistoryReply.self).versions
        }
        if json {
            var o: [String: Any] = [
                "path": p, "size": Int64(st.st_size), "version": version, "status": status,
                "conflicts": copies.map { ["name": $0.name, "path": $0.path, "device": $0.device, "date": $0.date,
                                           "size": $0.size, "version": $0.version] as [String: Any] },
            ]
            if all {
                o["history"] = history.map { h -> [String: Any] in
                    ["version": h.version, "size": h.size, "device": h.device,
                     "mtime": timeText(h.mtimeNs, minutes: false), "current": h.current]
                }
            }
            print(jsonLine(o))
            return
        }
        print("\(p)  \(status)  \(humanBytes(Int64(st.st_size)))  version \(version.isEmpty ? "(not in the store yet)" : version)")
        if copies.isEmpty {
            print("no conflict copies")
        } else {
            print("conflict copies (ubiq resolve settles them):")
            for c in copies {
                print("  \(c.name)  \(humanBytes(c.size))  from \(c.device) at \(c.date)  version \(c.version)")
            }
        }
        if all {
            print("versions in the store (ubiq restore brings one back):")
            for h in history {
                let mark = h.current ? "  (current)" : ""
                let device = h.device.isEmpty ? "" : "  from \(h.device)"
                print("  \(h.version)  \(humanBytes(h.size))  \(timeText(h.mtimeNs, minutes: true))\(device)\(mark)")
            }
        }
    }
}

struct Resolve: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Settle a conflict: keep one version (or a merged file) and remove the other copies, on every device.",
        discussion: prose("""
            --keep current    the file as it is; the conflict copies are deleted.
            --keep COPY       a conflict copy (its name, or its version from `ubiq versions`) takes
                              the file's name; the other copies are deleted.
            --with FILE       FILE's bytes (a merge you made) become the file; the copies are deleted.

            All of it is done through the mount, so it reaches every device as ordinary changes.

            Examples:
              ubiq resolve ~/Ubiquity/plan.txt --keep current
              ubiq resolve ~/Ubiquity/plan.txt --keep "plan (conflict laptop-3fa2 2026-11-23 140512).txt"
              ubiq resolve ~/Ubiquity/plan.txt --with ~/merged-plan.txt
            """))

    @Option(help: ArgumentHelp("current, or a conflict copy's name or version.", valueName: "VERSION"))
    var keep: String?

    @Option(help: ArgumentHelp("A file holding the merged content.", valueName: "FILE"), completion: .file())
    var with: String?

    @Argument(help: "A file in a ubiq mount.", completion: .file())
    var path: String

    func validate() throws {
        if (keep == nil) == (with == nil) { throw ValidationError("give one of --keep current|VERSION or --with FILE") }
    }

    func run() throws {
        let p = fileInMount(path)
        let copies = conflictCopies(of: p)
        var remove = copies
        if let keep, keep != "current" {
            guard let chosen = copies.first(where: { $0.name == keep || $0.path == Paths.absolute(keep) || $0.version == keep })
            else {
                fail("\(keep) is not a conflict copy of \(path) (ubiq versions \(path) lists them)")
            }
            if rename(chosen.path, p) != 0 { fail("cannot keep \(chosen.name): \(String(cString: strerror(errno)))") }
            remove.removeAll { $0.path == chosen.path }
            print("kept \(chosen.name) as \(p)")
        } else if let with {
            let source = Paths.absolute(with)
            guard let data = FileManager.default.contents(atPath: source) else { fail("cannot read \(with)") }
            let fd = open(p, O_WRONLY | O_TRUNC)
            if fd < 0 { fail("cannot write \(path): \(String(cString: strerror(errno)))") }
            do {
                try LocalFile.writeAll(data, to: fd)
            } catch {
                close(fd)
                fail("cannot write \(path): \(error)")
            }
            if fsync(fd) != 0 || close(fd) != 0 { fail("cannot write \(path): \(String(cString: strerror(errno)))") }
            print("wrote \(with) into \(p)")
        } else if copies.isEmpty {
            print("\(p) has no conflict copies")
        }
        for c in remove {
            if unlink(c.path) != 0 { fail("cannot delete \(c.name): \(String(cString: strerror(errno)))") }
            print("deleted \(c.name)")
        }
        // The settlement goes to the store now, not after the delay that gathers saves.
        let control = Mounts.ubiqMount(containing: p).flatMap(ControlClient.reach(mount:))
        _ = askToSync(p, control: control, full: false)
        control?.close()
    }
}

struct Restore: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Bring back a version the store keeps of a file, as its newest version.",
        discussion: prose("""
            The version is copied in the store (nothing is downloaded) and reaches every device. Refused
            while the file has changes here that are not uploaded yet.

            Example:
              ubiq versions --all ~/Ubiquity/plan.txt
              ubiq restore ~/Ubiquity/plan.txt 0193a7c2-...
            """))

    @Argument(help: "A file in a ubiq mount.", completion: .file())
    var path: String

    @Argument(help: "A version, as `ubiq versions --all` lists it.")
    var version: String

    func run() throws {
        let p = fileInMount(path)
        let client = ControlClient.connect(for: p)
        defer { client.close() }
        let reply = client.request(.restore(path: client.relative(p), version: version), as: RestoreReply.self)
        print("restored \(p) (now version \(reply.version))")
    }
}

enum LocalFile {
    static func writeAll(_ data: Data, to fd: Int32) throws {
        try data.withUnsafeBytes { buf in
            var done = 0
            while done < buf.count {
                let n = write(fd, buf.baseAddress! + done, buf.count - done)
                if n < 0 {
                    if errno == EINTR { continue }
                    throw UserError(String(cString: strerror(errno)))
                }
                done += n
            }
        }
    }
}
