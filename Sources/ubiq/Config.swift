import Foundation

/// Defaults for `ubiq mount`, from `$XDG_CONFIG_HOME/ubiq/config` (default
/// `~/.config/ubiq/config`): `name = value` lines, `#` comments. Names are the mount
/// options without their dashes' prefix (`store`, `cache-size`, `poll-interval`, ...);
/// flags take `true` or `false`. What the command line says wins.
enum Config {
    static var path: String { Paths.configHome + "/ubiq/config" }

    static let valued = ["store"] + MountHelper.valued
    static let flags = MountHelper.flags

    /// `args` (a `mount` command line) with the config's defaults added for what it does not set.
    static func apply(to args: [String]) -> [String] {
        guard args.first == "mount", let text = try? String(contentsOfFile: path, encoding: .utf8) else { return args }
        var extra: [String] = []
        for (n, raw) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            let line = raw.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? ""
            let trimmed = line.trimmingCharacters(in: .whitespaces)
            if trimmed.isEmpty { continue }
            let parts = trimmed.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard parts.count == 2, !parts[1].isEmpty else { fail("\(path) line \(n + 1): expected name = value") }
            let (name, value) = (parts[0], parts[1])
            let flag = "--" + name
            if args.contains(flag) || args.contains(where: { $0.hasPrefix(flag + "=") }) { continue }
            if valued.contains(name) {
                extra += [flag, value]
            } else if flags.contains(name) {
                switch value {
                case "true", "yes", "1": extra.append(flag)
                case "false", "no", "0": break
                default: fail("\(path) line \(n + 1): \(name) takes true or false, not \(value)")
                }
            } else {
                fail("\(path) line \(n + 1): unknown setting \(name) (known: \((valued + flags).joined(separator: ", ")))")
            }
        }
        return extra.isEmpty ? args : [args[0]] + extra + args.dropFirst()
    }
}
