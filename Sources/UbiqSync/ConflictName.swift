import Foundation

/// Names of conflict copies: when two devices changed one file, the version this device
/// did not write is kept beside it as "NAME (conflict DEVICE DATE).EXT", an ordinary file
/// every device sees (docs/sync.md). The name says which file it belongs to, so any tool
/// can find it, and renaming it away makes it an ordinary file again.
public enum ConflictName {
    static let marker = " (conflict "

    /// The conflict copy's name for `name`: written by `device` at `date` (local time);
    /// `counter` above 1 tells apart copies that would otherwise share a name. Never longer
    /// than `maxBytes`: the stem is shortened to fit.
    public static func make(for name: String, device: String, date: Date, counter: Int = 1,
                            maxBytes: Int = 255) -> String {
        let (stem, ext) = split(name)
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.dateFormat = "yyyy-MM-dd HHmmss"
        var tag = marker + deviceLabel(device) + " " + f.string(from: date)
        if counter > 1 { tag += " \(counter)" }
        tag += ")"
        var s = stem
        while !s.isEmpty && s.utf8.count + tag.utf8.count + ext.utf8.count > maxBytes { s.removeLast() }
        return s + tag + ext
    }

    /// The name a conflict copy was made for ("report.txt" for "report (conflict laptop
    /// 2026-11-23 140512).txt"); nil when `name` is not a conflict copy's name.
    public static func target(of name: String) -> String? {
        guard let r = name.range(of: marker, options: .backwards) else { return nil }
        let stem = name[..<r.lowerBound]
        let rest = name[r.upperBound...]
        guard !stem.isEmpty, let close = rest.firstIndex(of: ")") else { return nil }
        let inner = rest[..<close].split(separator: " ", omittingEmptySubsequences: false)
        let ext = rest[rest.index(after: close)...]
        guard inner.count == 3 || inner.count == 4, !inner[0].isEmpty,
              isDigits(inner[1], "dddd-dd-dd"), isDigits(inner[2], "dddddd"),
              inner.count == 3 || (!inner[3].isEmpty && inner[3].allSatisfy(\.isNumber)),
              ext.isEmpty || (ext.first == "." && !ext.contains("(") && !ext.contains(")")) else { return nil }
        return String(stem) + ext
    }

    /// The device and time a conflict copy's name gives (for listings).
    public static func origin(of name: String) -> (device: String, date: String)? {
        guard target(of: name) != nil, let r = name.range(of: marker, options: .backwards),
              let close = name[r.upperBound...].firstIndex(of: ")") else { return nil }
        let inner = name[r.upperBound..<close].split(separator: " ")
        return (String(inner[0]), inner[1] + " " + inner[2])
    }

    /// A device's name as it goes into a conflict copy's name: one word, no brackets.
    public static func deviceLabel(_ device: String) -> String {
        let cleaned = String(device.map { c -> Character in
            c == " " || c == "(" || c == ")" || c == "/" || c.isNewline ? "-" : c
        }.prefix(40))
        return cleaned.isEmpty ? "device" : cleaned
    }

    /// "name.ext" → ("name", ".ext"); a leading dot, or a long or spaced tail, is no extension.
    static func split(_ name: String) -> (String, String) {
        guard let dot = name.lastIndex(of: "."), dot != name.startIndex else { return (name, "") }
        let ext = name[dot...]
        if ext.count > 16 || ext.contains(" ") || ext.contains("(") || ext.contains(")") { return (name, "") }
        return (String(name[..<dot]), String(ext))
    }

    private static func isDigits(_ s: Substring, _ shape: String) -> Bool {
        s.count == shape.count && zip(s, shape).allSatisfy { c, p in p == "d" ? c.isASCII && c.isNumber : c == p }
    }
}
