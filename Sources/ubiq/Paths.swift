import Foundation
import CUbiq
import UbiqStore

/// Where things live by default (XDG base directories).
enum Paths {
    static var home: String { ProcessInfo.processInfo.environment["HOME"] ?? NSHomeDirectory() }

    /// An XDG base directory: the variable when set and not empty, else the default.
    static func xdg(_ variable: String) -> String? {
        ProcessInfo.processInfo.environment[variable].flatMap { $0.isEmpty ? nil : $0 }
    }

    static var dataHome: String { xdg("XDG_DATA_HOME") ?? home + "/.local/share" }
    static var stateHome: String { xdg("XDG_STATE_HOME") ?? home + "/.local/state" }
    static var configHome: String { xdg("XDG_CONFIG_HOME") ?? home + "/.config" }

    static var defaultStore: String { dataHome + "/ubiq/store" }

    /// One state directory per mount point: two mount points of one store are two devices.
    static func defaultState(for mountpoint: String) -> String {
        stateHome + "/ubiq/" + mountID(mountpoint)
    }

    static func registry(for mountpoint: String) -> String {
        stateHome + "/ubiq/mounts/" + mountID(mountpoint) + ".json"
    }

    static func mountID(_ mountpoint: String) -> String {
        var h: UInt64 = 0xcbf29ce484222325
        for b in mountpoint.utf8 { h = (h ^ UInt64(b)) &* 0x100000001b3 }
        let readable = mountpoint.split(separator: "/").suffix(2).joined(separator: "-")
            .map { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." ? $0 : "_" }
        return String(readable.prefix(60)) + "-" + String(h & 0xffff_ffff, radix: 16)
    }

    /// Absolute, with symlinks resolved where the path exists.
    static func absolute(_ path: String) -> String {
        let expanded = (path as NSString).expandingTildeInPath
        let abs = expanded.hasPrefix("/") ? expanded : FileManager.default.currentDirectoryPath + "/" + expanded
        if let r = realpath(abs, nil) {
            defer { free(r) }
            return String(cString: r)
        }
        return (abs as NSString).standardizingPath
    }
}

/// What a running daemon leaves for `ubiq unmount` to find it.
struct MountRecord: Codable {
    var pid: Int32
    var mountpoint: String
    var state: String
    var store: String
}

enum Mounts {
    /// The whole mount table. (Foundation reads a file as long as stat says it is, and a /proc
    /// file says 0: it read the first 4 KiB, and a machine with many mounts lost ours.)
    static func mountinfo() -> String? {
        let fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)
        if fd < 0 { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 { if errno == EINTR { continue }; return nil }
            if n == 0 { break }
            out += buf[..<n]
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The mount table entry for `path`, if any: its fstype, source, and the file system's own
    /// options (a FUSE mount's `allow_other`, `user_id=0`).
    static func entry(at path: String) -> (type: String, source: String, superOptions: [String])? {
        guard let text = mountinfo() else { return nil }
        for line in text.split(separator: "\n") {
            let f = line.split(separator: " ")
            guard f.count > 9, let dash = f.firstIndex(of: "-"), dash + 2 < f.count else { continue }
            if unescape(String(f[4])).sameBytes(path) {
                let options = dash + 3 < f.count ? f[dash + 3].split(separator: ",").map(String.init) : []
                return (String(f[dash + 1]), String(f[dash + 2]), options)
            }
        }
        return nil
    }

    static func unescape(_ s: String) -> String {
        var out = ""
        var it = Array(s.utf8)[...]
        var bytes: [UInt8] = []
        while let c = it.first {
            if c == UInt8(ascii: "\\"), it.count >= 4, let v = UInt8(String(decoding: it.dropFirst().prefix(3), as: UTF8.self), radix: 8) {
                bytes.append(v); it = it.dropFirst(4)
            } else { bytes.append(c); it = it.dropFirst() }
        }
        out = String(decoding: bytes, as: UTF8.self)
        return out
    }

    /// The ubiq mount point that `path` is in, if any (the innermost mount containing it must be ubiq's).
    static func ubiqMount(containing path: String) -> String? {
        guard let text = mountinfo() else { return nil }
        var best: (mountpoint: String, type: String)?
        for line in text.split(separator: "\n") {
            let f = line.split(separator: " ")
            guard f.count > 9, let dash = f.firstIndex(of: "-"), dash + 1 < f.count else { continue }
            let mp = unescape(String(f[4]))
            let inside = path.sameBytes(mp) || path.utf8.starts(with: (mp == "/" ? "/" : mp + "/").utf8)
            if inside && mp.utf8.count >= (best?.mountpoint.utf8.count ?? -1) { best = (mp, String(f[dash + 1])) }
        }
        return best?.type == "fuse.ubiq" ? best?.mountpoint : nil
    }

    static func record(for mountpoint: String) -> MountRecord? {
        guard let d = FileManager.default.contents(atPath: Paths.registry(for: mountpoint)) else { return nil }
        return try? JSONDecoder().decode(MountRecord.self, from: d)
    }

    static func isAlive(_ pid: Int32) -> Bool { kill(pid, 0) == 0 || errno == EPERM }

    /// Whether the daemon of `rec` still runs: it holds its state directory's lock. A daemon
    /// that died holds nothing, even while it is a zombie not yet reaped (which `kill(pid, 0)`
    /// takes for alive). Where the lock cannot be looked at, the process is asked.
    static func isRunning(_ rec: MountRecord) -> Bool {
        StateLock.isHeld(rec.state) ?? isAlive(rec.pid)
    }

    static func fusermount(_ args: [String]) -> Bool {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = ["fusermount3"] + args
        p.standardError = FileHandle.nullDevice
        p.standardOutput = FileHandle.nullDevice
        do { try p.run() } catch { return false }
        p.waitUntilExit()
        return p.terminationStatus == 0
    }
}

/// A path as the bytes the kernel knows, for names that are not UTF-8 (which a Swift String
/// cannot hold: the argument parser and FileManager turn their bytes into U+FFFD).
struct BytePath {
    var bytes: [UInt8]

    /// The bytes of the argument that `text` was parsed from, made absolute (and resolved, as
    /// `Paths.absolute` does, when it is valid UTF-8).
    static func argument(_ text: String) -> BytePath {
        if !text.contains("\u{FFFD}") { return BytePath(bytes: Array(Paths.absolute(text).utf8)) }
        var raw = Array(text.utf8)
        for i in 1 ..< Int(CommandLine.argc) {
            guard let p = CommandLine.unsafeArgv[i] else { continue }
            let b = Array(UnsafeBufferPointer(start: UnsafeRawPointer(p).assumingMemoryBound(to: UInt8.self), count: strlen(p)))
            if String(decoding: b, as: UTF8.self) == text { raw = b; break }
        }
        if raw.first != UInt8(ascii: "/") { raw = Array(FileManager.default.currentDirectoryPath.utf8) + [UInt8(ascii: "/")] + raw }
        return BytePath(bytes: raw)
    }

    /// For people: the path, with each byte of a name that is not UTF-8 written \xNN.
    var display: String {
        if let s = String(validating: bytes, as: UTF8.self) { return s }
        return bytes.map { $0 < 0x80 ? String(UnicodeScalar($0)) : String(format: "\\x%02x", $0) }.joined()
    }

    /// Runs `body` with the path as a C string.
    func withCString<T>(_ body: (UnsafePointer<CChar>) -> T) -> T {
        (bytes + [0]).withUnsafeBufferPointer { b in b.withMemoryRebound(to: CChar.self) { body($0.baseAddress!) } }
    }

    func lstat() -> stat? {
        var st = Glibc.stat()
        return withCString { Glibc.lstat($0, &st) } == 0 ? st : nil
    }

    func attribute(_ name: String) -> String? {
        var buf = [UInt8](repeating: 0, count: 4096)
        let n = withCString { cubiq_getxattr($0, name, &buf, buf.count) }
        return n < 0 ? nil : String(decoding: buf[..<n], as: UTF8.self)
    }

    func setAttribute(_ name: String, _ value: String) -> Int32 {
        let r = withCString { p in value.withCString { v in cubiq_setxattr(p, name, v, strlen(v)) } }
        return r == 0 ? 0 : cubiq_errno()
    }

    /// Every regular file at or under this path, by the names' own bytes.
    func regularFiles() -> [BytePath] {
        guard let st = lstat() else { return [] }
        switch st.st_mode & S_IFMT {
        case S_IFREG: return [self]
        case S_IFDIR: return descendants().filter { $0.lstat().map { ($0.st_mode & S_IFMT) == S_IFREG } ?? false }
        default: return []
        }
    }

    /// The paths given on the command line, by their own bytes, each checked to be inside a
    /// ubiq mount (a name that is not UTF-8 is an item like any other).
    static func inMounts(_ paths: [String]) -> [BytePath] {
        paths.map { p in
            let b = argument(p)
            guard b.lstat() != nil else { fail("\(p): no such file or directory") }
            guard Mounts.ubiqMount(containing: b.display) != nil else { fail("\(p) is not in a ubiq mount") }
            return b
        }
    }

    /// Everything under this folder, depth first, by the names' own bytes.
    func descendants() -> [BytePath] {
        guard let dir = withCString({ opendir($0) }) else { return [] }
        var names: [[UInt8]] = []
        while let e = readdir(dir) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { raw in Array(raw.prefix { $0 != 0 }) }
            if name != [46] && name != [46, 46] { names.append(name) }
        }
        closedir(dir)
        var out: [BytePath] = []
        for name in names.sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            let child = BytePath(bytes: bytes + [UInt8(ascii: "/")] + name)
            out.append(child)
            if let st = child.lstat(), (st.st_mode & S_IFMT) == S_IFDIR { out += child.descendants() }
        }
        return out
    }
}
