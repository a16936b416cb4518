import ArgumentParser
import Foundation

struct Ubiq: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ubiq",
        abstract: "Mount a cloud store as a folder: every file visible at once, content on demand.",
        discussion: prose("""
            Examples:
              ubiq mount ~/Ubiquity                 mount the default store
              ubiq mount --store dir:/srv/s ~/Work  mount another store
              ubiq download --wait ~/Ubiquity/Docs  keep a folder here offline
              ubiq evict ~/Ubiquity/Videos          free space; files stay visible
              ubiq pin ~/Ubiquity/Docs              keep a folder downloaded
              ubiq sync ~/Ubiquity                  look for other devices' changes now
              ubiq unmount ~/Ubiquity               upload what is pending, unmount
              ubiq kv set --store dir:/srv/s k v    a synced setting
            """),
        version: ubiqVersion,
        subcommands: [Mount.self, Unmount.self, Status.self, Query.self, Watch.self, Sync.self, Pause.self, Resume.self, Versions.self, Resolve.self,
                      Restore.self, Recover.self, Service.self, Download.self, Evict.self, Pin.self, Unpin.self, KV.self, Container.self])
}

let ubiqVersion = "0.1.0"

/// A failure with one line for the user; exit status 1.
struct UserError: Error, CustomStringConvertible {
    let message: String
    init(_ message: String) { self.message = message }
    var description: String { message }
}

/// Why `value`, given as `flag`, is not a number of seconds this command takes (nil: it is):
/// at most a day, more than zero unless `zero` is allowed; never NaN or infinite, which would
/// otherwise pass a comparison or stop a conversion to a whole number.
/// "30m", "2h", "7d", "45s": seconds (nil: not a length of time). `query --newer-than` and
/// `pause --for` read lengths so.
func lengthOfTime(_ s: String) -> Double? {
    let units: [Character: Double] = ["s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604_800]
    guard let u = s.last, let mult = units[u], let n = Double(s.dropLast()), n >= 0, n.isFinite else { return nil }
    return n * mult
}

func secondsRefused(_ value: Double, _ flag: String, zero: Bool = false) -> String? {
    let ok = value.isFinite && (zero ? value >= 0 : value > 0) && value <= 86_400
    return ok ? nil : "\(flag) must be \(zero ? "from" : "more than") 0 \(zero ? "to" : "and at most") 86400 seconds, not \(value)"
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("ubiq: \(message)\n".utf8))
    exit(1)
}

/// Help text as written in the source, made ready for the argument parser, which wraps every
/// line to the terminal on its own: the lines of a paragraph are joined into one, while blank
/// lines, indented lines (examples, lists) and the line after one ending in ":" stay as written.
func prose(_ text: String) -> String {
    var out: [String] = []
    for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
        if let last = out.last, !last.isEmpty, !line.isEmpty, !line.hasPrefix(" "), !last.hasPrefix(" "),
           !last.hasSuffix(":") {
            out[out.count - 1] = last + " " + line
        } else {
            out.append(line)
        }
    }
    return out.joined(separator: "\n")
}
