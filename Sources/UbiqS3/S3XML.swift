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
        S3Client.xmlUnescape(String(decoding: UnsafeBufferPointer(rebasing: bytes[range]), as: UTF8.self))
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
            S3XML.elements(name, in: b).map { String(decoding: UnsafeBufferPointer(rebasing: b[$0]), as: UTF8.self) }
        }
    }
}
