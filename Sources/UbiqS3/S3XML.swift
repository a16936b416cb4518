import Foundation

/// S3's answers are small, flat XML: elements found by their tags in the answer's UTF-8
/// bytes. A listing of a thousand objects is read in one pass over its bytes, where finding
/// each tag with `String.range(of:)` (Foundation, by UTF-16 characters) was 30% of a fresh
/// mount's CPU time at 100,000 objects.
enum S3XML {
    /// The byte ranges of the inner text of each `<name>` element within `within` of `bytes`,
    /// in order (at most `limit`). An element opened and not closed ends the search. A tag is
    /// matched exactly (`<Key>`, not `<Key attr="…">`, which S3 does not write).
    static func elements(_ name: String, in bytes: UnsafeBufferPointer<UInt8>, within: Range<Int>? = nil,
                         limit: Int = .max) -> [Range<Int>] {
        let open = Array("<\(name)>".utf8), close = Array("</\(name)>".utf8)
        var out: [Range<Int>] = []
        var at = within?.lowerBound ?? 0
        let end = within?.upperBound ?? bytes.count
        while out.count < limit, let o = find(open, in: bytes, from: at, to: end),
              let c = find(close, in: bytes, from: o + open.count, to: end) {
            out.append(o + open.count ..< c)
            at = c + close.count
        }
        return out
    }

    /// The inner text of the first `<name>` element within `within`, entities decoded.
    static func value(_ name: String, in bytes: UnsafeBufferPointer<UInt8>, within: Range<Int>? = nil) -> String? {
        elements(name, in: bytes, within: within, limit: 1).first.map { text(bytes, $0) }
    }

    /// The bytes of `range` as text, entities decoded.
    static func text(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> String {
        S3Client.xmlUnescape(raw(bytes, range))
    }

    /// The bytes of `range` as text, as they are.
    static func raw(_ bytes: UnsafeBufferPointer<UInt8>, _ range: Range<Int>) -> String {
        String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self)
    }

    /// Where `needle` first starts in `bytes[from ..< to]`.
    private static func find(_ needle: [UInt8], in bytes: UnsafeBufferPointer<UInt8>, from: Int, to: Int) -> Int? {
        guard let base = bytes.baseAddress, let first = needle.first else { return nil }
        var at = from
        while to - at >= needle.count {
            guard let hit = memchr(base + at, Int32(first), to - needle.count + 1 - at) else { return nil }
            let i = base.distance(to: hit.assumingMemoryBound(to: UInt8.self))
            if memcmp(base + i, needle, needle.count) == 0 { return i }
            at = i + 1
        }
        return nil
    }

    /// `body` with the UTF-8 bytes of `xml` (a native string's own storage: no copy).
    static func reading<T>(_ xml: String, _ body: (UnsafeBufferPointer<UInt8>) throws -> T) rethrows -> T {
        var xml = xml
        return try xml.withUTF8(body)
    }
}

extension S3Client {
    /// The text of the first `<name>` element (S3 answers are small, flat XML).
    static func xmlValue(_ name: String, in xml: String) -> String? {
        S3XML.reading(xml) { S3XML.value(name, in: $0) }
    }

    /// The inner text of every `<name>` element, in order (S3's answers are flat lists).
    static func xmlBlocks(_ name: String, in xml: String) -> [String] {
        S3XML.reading(xml) { b in
            S3XML.elements(name, in: b).map { S3XML.raw(b, $0) }
        }
    }

    /// XML's five named entities and numeric ones (`&#34;`, `&#x22;`), read on the bytes (an
    /// ETag in a listing is `&#34;…&#34;`: a million of them at a fresh mount). What is not an
    /// entity stays as it is.
    static func xmlUnescape(_ s: String) -> String {
        guard s.utf8.contains(UInt8(ascii: "&")) else { return s }
        let u = Array(s.utf8)
        var out: [UInt8] = []
        out.reserveCapacity(u.count)
        var i = 0
        while i < u.count {
            guard u[i] == UInt8(ascii: "&"), let semi = u[(i + 1)...].prefix(10).firstIndex(of: UInt8(ascii: ";")) else {
                out.append(u[i]); i += 1; continue
            }
            let name = u[(i + 1) ..< semi]
            var decoded: Unicode.Scalar?
            switch String(decoding: name, as: UTF8.self) {
            case "lt": decoded = "<"
            case "gt": decoded = ">"
            case "quot": decoded = "\""
            case "apos": decoded = "'"
            case "amp": decoded = "&"
            case let n where n.hasPrefix("#x") || n.hasPrefix("#X"): decoded = UInt32(n.dropFirst(2), radix: 16).flatMap(Unicode.Scalar.init)
            case let n where n.hasPrefix("#"): decoded = UInt32(n.dropFirst()).flatMap(Unicode.Scalar.init)
            default: break
            }
            if let decoded {
                out.append(contentsOf: String(Character(decoded)).utf8)
                i = semi + 1
            } else {
                out.append(u[i]); i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}
