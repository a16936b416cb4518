import ArgumentParser
import CUbiq
import Foundation
import UbiqFS
import UbiqState

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the sync state of files and folders: here or not, in the store or not, errors.",
        discussion: prose("""
            A line per item: state, local/total size, percent downloaded, pinned, pending upload and
            the last error; then a summary, and the mount's cache use and limit. States, most urgent
            first: conflict, error, uploading, downloading, local, placeholder, current. A folder
            shows the most urgent state of what is under it. --json: one JSON document, described
            in docs/status.md.

            The same is in read-only extended attributes, answered by name and never listed (so
            copies and backups do not carry them): getfattr -n user.ubiq.NAME PATH, where NAME is, of
            files, of folders, and also of the mount's root folder:
            \(attributeList("files:", FileSystem.statusAttributes))
            \(attributeList("folders:", FileSystem.folderAttributes))
            \(attributeList("root:", ["cache-bytes", "cache-limit"] + FileSystem.storeAttributes))

            Examples:
              ubiq status ~/Ubiquity/report.pdf
              ubiq status -r ~/Ubiquity/Photos
            """))

    @Flag(name: .short, help: "List everything under folders too.")
    var recursive = false

    @Flag(help: "One JSON document (docs/status.md).")
    var json = false

    @Argument(help: "Files or folders in a ubiq mount.", completion: .file())
    var paths: [String]

    struct Item {
        var path: String
        var isDirectory: Bool
        var attrs: [String: String]
        var size: Int64
        var local: Int64
        var isFile: Bool
        var status: String { attrs["status"] ?? "unknown" }
    }

    func run() throws {
        // By the bytes of each path: a name that is not UTF-8 is answered like any other.
        let roots = BytePath.inMounts(paths)
        var items: [Item] = []
        for root in roots {
            items.append(item(root))
            if recursive, let st = root.lstat(), (st.st_mode & S_IFMT) == S_IFDIR {
                items += root.descendants().map(item)
            }
        }
        let mounts = Set(roots.compactMap { Mounts.ubiqMount(containing: $0.display) }).sorted()
        let caches = mounts.map { m in
            (mount: m, used: Int64(getAttribute(m, "user.ubiq.cache-bytes") ?? "") ?? 0,
             limit: Int64(getAttribute(m, "user.ubiq.cache-limit") ?? "") ?? 0)
        }
        let stores = mounts.map { m in
            (mount: m, reached: getAttribute(m, "user.ubiq.store-reached") ?? "", error: getAttribute(m, "user.ubiq.store-error") ?? "",
             listing: getAttribute(m, "user.ubiq.store-listing") == "1", paused: getAttribute(m, "user.ubiq.sync-paused") ?? "")
        }
        var counts: [String: Int] = [:]
        for i in items { counts[i.status, default: 0] += 1 }
        if json {
            let list: [[String: Any]] = items.map { i in
                var o: [String: Any] = ["path": i.path, "type": i.isDirectory ? "folder" : "file", "status": i.status,
                                        "size": i.size, "localBytes": i.local, "pinned": i.attrs["pinned"] == "1"]
                if i.isDirectory {
                    for k in ["items", "items-not-downloaded", "items-uploading", "items-conflicts", "items-errors"] {
                        o[camel(k)] = Int(i.attrs[k] ?? "0") ?? 0
                    }
                } else {
                    o["percentDownloaded"] = Int(i.attrs["percent-downloaded"] ?? "0") ?? 0
                    o["downloadingStatus"] = i.attrs["downloading-status"] ?? ""
                    o["uploaded"] = i.attrs["uploaded"] == "1"
                    o["uploading"] = i.attrs["uploading"] == "1"
                    o["conflict"] = i.attrs["conflicts"] == "1"
                    o["version"] = i.attrs["version"] ?? ""
                    o["downloadingError"] = i.attrs["downloading-error"] ?? ""
                    o["uploadingError"] = i.attrs["uploading-error"] ?? ""
                }
                return o
            }
            let doc: [String: Any] = ["items": list, "summary": counts,
                                      "caches": caches.map { ["mount": $0.mount, "usedBytes": $0.used, "limitBytes": $0.limit] },
                                      "stores": stores.map { ["mount": $0.mount, "reached": $0.reached.isEmpty ? NSNull() : $0.reached,
                                                              "error": $0.error.isEmpty ? NSNull() : $0.error, "listing": $0.listing,
                                                              "paused": $0.paused.isEmpty ? NSNull() : $0.paused] as [String: Any] }]
            let data = try JSONSerialization.data(withJSONObject: doc, options: [.sortedKeys, .prettyPrinted, .withoutEscapingSlashes])
            print(String(decoding: data, as: UTF8.self))
            return
        }
        let colour = isatty(1) != 0 && ProcessInfo.processInfo.environment["NO_COLOR"] == nil
        for i in items {
            var notes: [String] = []
            if i.attrs["pinned"] == "1" { notes.append("pinned") }
            if i.isDirectory {
                let n = Int(i.attrs["items"] ?? "0") ?? 0
                notes.append("\(n) items")
                for (k, what) in [("items-not-downloaded", "not downloaded"), ("items-uploading", "to upload"),
                                  ("items-conflicts", "in conflict"), ("items-errors", "with errors")] {
                    if let v = Int(i.attrs[k] ?? "0"), v > 0 { notes.append("\(v) \(what)") }
                }
            } else if i.isFile {
                if i.attrs["uploading"] == "1" { notes.append("upload pending") }
                if let e = i.attrs["uploading-error"], !e.isEmpty { notes.append("upload error: \(e)") }
                if let e = i.attrs["downloading-error"], !e.isEmpty { notes.append("download error: \(e)") }
            }
            let pct = i.isFile ? "\(i.attrs["percent-downloaded"] ?? "?")%" : ""
            let state = i.status.padding(toLength: 11, withPad: " ", startingAt: 0)
            let sizes = !i.isFile ? "-" : "\(humanBytes(i.local))/\(humanBytes(i.size))"
            let line = "\(paint(state, i.status, colour)) \(sizes.padding(toLength: 21, withPad: " ", startingAt: 0)) "
                + "\(pct.padding(toLength: 5, withPad: " ", startingAt: 0)) \(i.path)"
                + (notes.isEmpty ? "" : "  (" + notes.joined(separator: ", ") + ")")
            print(line)
        }
        let summary = counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")
        print("\(items.count) items: \(summary)")
        for c in caches {
            print("cache of \(c.mount): \(humanBytes(c.used)) used" + (c.limit > 0 ? " of \(humanBytes(c.limit))" : ", no limit"))
        }
        for st in stores {
            var said: [String] = []
            if !st.paused.isEmpty {
                said.append("sync paused " + (st.paused == "indefinitely" ? "until ubiq resume" : "until \(st.paused)"))
            }
            if st.listing { said.append("listing it (the first look since the mount; what is shown is what this device has brought in so far)") }
            said.append(Self.reached(st.reached))
            if !st.error.isEmpty { said.append("the last look failed: \(st.error)") }
            print("store of \(st.mount): " + said.joined(separator: "; "))
        }
    }

    /// When the store was last reached, as the root's `user.ubiq.store-reached` says (ISO 8601;
    /// empty: not since the mount).
    static func reached(_ attribute: String) -> String {
        guard let at = ISO8601DateFormatter().date(from: attribute) else { return "not reached since the mount" }
        return "last reached \(max(0, Int(Date().timeIntervalSince(at)))) s ago (\(attribute))"
    }

    private func item(_ path: BytePath) -> Item {
        let st = path.lstat() ?? stat()
        let isDir = (st.st_mode & S_IFMT) == S_IFDIR
        var attrs: [String: String] = [:]
        for n in isDir ? FileSystem.folderAttributes : FileSystem.statusAttributes {
            attrs[n] = path.attribute("user.ubiq." + n)
        }
        // Symlinks and special files carry no attributes of their own (xattrs follow links).
        if (st.st_mode & S_IFMT) == S_IFLNK { attrs = ["status": "current"] }
        let isFile = (st.st_mode & S_IFMT) == S_IFREG
        let size = isFile ? Int64(st.st_size) : 0
        let local = isFile ? min(size, Int64(st.st_blocks) * 512) : 0
        return Item(path: path.display, isDirectory: isDir, attrs: attrs, size: size, local: local, isFile: isFile)
    }

    private func camel(_ s: String) -> String {
        let parts = s.split(separator: "-")
        return String(parts[0]) + parts.dropFirst().map { $0.prefix(1).uppercased() + $0.dropFirst() }.joined()
    }

    private func paint(_ text: String, _ status: String, _ on: Bool) -> String {
        guard on else { return text }
        let code: String
        switch SyncStatus(rawValue: status) {
        case .conflict, .error: code = "31"
        case .uploading, .downloading: code = "33"
        case .local, .placeholder: code = "36"
        case .current, nil: code = "32"
        }
        return "\u{1B}[\(code)m\(text)\u{1B}[0m"
    }
}

/// "  files:   a, b, c," for the help: names wrapped before column 78, aligned under the first.
private func attributeList(_ label: String, _ names: [String]) -> String {
    let head = "  " + label.padding(toLength: 9, withPad: " ", startingAt: 0)
    var lines: [String] = []
    var line = head
    for (i, name) in names.enumerated() {
        let word = name + (i < names.count - 1 ? "," : "")
        if line == head {
            line += word
        } else if line.count + 1 + word.count > 78 {
            lines.append(line)
            line = String(repeating: " ", count: head.count) + word
        } else {
            line += " " + word
        }
    }
    lines.append(line)
    return lines.joined(separator: "\n")
}
