import Foundation

/// A reader of JSON as ubiq writes it: objects, arrays, strings, integers, true, false and
/// null, read from the bytes in one pass. Foundation's JSONDecoder takes about 20 µs for an
/// object's metadata (a snapshot of the bucket is a million of them); this takes a tenth.
///
/// It is a shortcut, never a second opinion: what it does not read plainly is nil — a
/// fraction or an exponent, a key twice in one object (or two spellings of one name that
/// Swift's strings count as one), a lone surrogate, bytes that are not UTF-8, anything
/// nested deeper than `maxDepth`, any text that is not JSON — and the caller reads that text
/// with JSONDecoder, as it did before.
public enum PlainJSON {
    public indirect enum Value: Equatable, Sendable {
        case string(String)
        /// An integer's digits, with its sign (`-?(0|[1-9][0-9]*)`, never `-0`).
        case integer(String)
        case bool(Bool)
        case null
        case object([String: Value])
        case array([Value])
    }

    public static let maxDepth = 16

    public static func parse(_ data: Data) -> Value? {
        data.withUnsafeBytes { raw in parse(raw.bindMemory(to: UInt8.self)) }
    }

    public static func parse(_ bytes: UnsafeBufferPointer<UInt8>) -> Value? {
        var p = Reader(b: bytes)
        guard let v = p.value(depth: 0) else { return nil }
        p.skipSpace()
        return p.i == bytes.count ? v : nil
    }
}

extension PlainJSON.Value {
    public var string: String? { if case .string(let s) = self { s } else { nil } }
    public var object: [String: PlainJSON.Value]? { if case .object(let o) = self { o } else { nil } }

    /// The integer, if it is one that fits `T`.
    public func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
        if case .integer(let digits) = self { T(digits) } else { nil }
    }
}

private struct Reader {
    let b: UnsafeBufferPointer<UInt8>
    var i = 0

    init(b: UnsafeBufferPointer<UInt8>) { self.b = b }

    mutating func skipSpace() {
        while i < b.count, b[i] == 0x20 || b[i] == 0x0A || b[i] == 0x0D || b[i] == 0x09 { i += 1 }
    }

    /// Whether the next byte (after spaces) is `c`; taken if so.
    mutating func take(_ c: UInt8) -> Bool {
        skipSpace()
        guard i < b.count, b[i] == c else { return false }
        i += 1
        return true
    }

    mutating func value(depth: Int) -> PlainJSON.Value? {
        guard depth < PlainJSON.maxDepth else { return nil }
        skipSpace()
        guard i < b.count else { return nil }
        switch b[i] {
        case UInt8(ascii: "{"):
            i += 1
            var out: [String: PlainJSON.Value] = [:]
            if take(UInt8(ascii: "}")) { return .object(out) }
            repeat {
                skipSpace()
                guard let k = string(), take(UInt8(ascii: ":")), let v = value(depth: depth + 1),
                      out.updateValue(v, forKey: k) == nil else { return nil }
            } while take(UInt8(ascii: ","))
            return take(UInt8(ascii: "}")) ? .object(out) : nil
        case UInt8(ascii: "["):
            i += 1
            var out: [PlainJSON.Value] = []
            if take(UInt8(ascii: "]")) { return .array(out) }
            repeat {
                guard let v = value(depth: depth + 1) else { return nil }
                out.append(v)
            } while take(UInt8(ascii: ","))
            return take(UInt8(ascii: "]")) ? .array(out) : nil
        case UInt8(ascii: "\""):
            return string().map { .string($0) }
        case UInt8(ascii: "t"): return literal("true") ? .bool(true) : nil
        case UInt8(ascii: "f"): return literal("false") ? .bool(false) : nil
        case UInt8(ascii: "n"): return literal("null") ? .null : nil
        default: return integer()
        }
    }

    mutating func literal(_ word: StaticString) -> Bool {
        let n = word.utf8CodeUnitCount
        guard b.count - i >= n, memcmp(b.baseAddress! + i, word.utf8Start, n) == 0 else { return false }
        i += n
        return true
    }

    mutating func integer() -> PlainJSON.Value? {
        let start = i
        if i < b.count, b[i] == UInt8(ascii: "-") { i += 1 }
        let digits = i
        while i < b.count, b[i] >= 0x30, b[i] <= 0x39 { i += 1 }
        let count = i - digits
        guard count > 0, count < 40, b[digits] != 0x30 || count == 1, !(count == 1 && b[digits] == 0x30 && digits > start) else { return nil }
        // A fraction or an exponent is JSONDecoder's to read.
        if i < b.count, b[i] == UInt8(ascii: ".") || b[i] == UInt8(ascii: "e") || b[i] == UInt8(ascii: "E") { return nil }
        return .integer(String(decoding: UnsafeBufferPointer(rebasing: b[start ..< i]), as: UTF8.self))
    }

    /// A string from its opening quote (nil: not one, or not plainly read).
    mutating func string() -> String? {
        guard i < b.count, b[i] == UInt8(ascii: "\"") else { return nil }
        i += 1
        let start = i
        while i < b.count {
            let c = b[i]
            if c == UInt8(ascii: "\"") {
                i += 1
                return String(validating: UnsafeBufferPointer(rebasing: b[start ..< i - 1]), as: UTF8.self)
            }
            if c == UInt8(ascii: "\\") { break }
            if c < 0x20 { return nil }
            i += 1
        }
        var bytes = Array(b[start ..< i])
        while i < b.count {
            let c = b[i]
            i += 1
            if c == UInt8(ascii: "\"") { return String(validating: bytes, as: UTF8.self) }
            if c < 0x20 { return nil }
            guard c == UInt8(ascii: "\\") else { bytes.append(c); continue }
            guard i < b.count else { return nil }
            let e = b[i]
            i += 1
            switch e {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): bytes.append(e)
            case UInt8(ascii: "b"): bytes.append(0x08)
            case UInt8(ascii: "f"): bytes.append(0x0C)
            case UInt8(ascii: "n"): bytes.append(0x0A)
            case UInt8(ascii: "r"): bytes.append(0x0D)
            case UInt8(ascii: "t"): bytes.append(0x09)
            case UInt8(ascii: "u"):
                guard var u = hex4() else { return nil }
                if (0xD800 ..< 0xDC00).contains(u) {
                    guard literal("\\u"), let low = hex4(), (0xDC00 ..< 0xE000).contains(low) else { return nil }
                    u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00 ..< 0xE000).contains(u) {
                    return nil
                }
                guard let scalar = Unicode.Scalar(u) else { return nil }
                bytes.append(contentsOf: String(Character(scalar)).utf8)
            default:
                return nil
            }
        }
        return nil
    }

    mutating func hex4() -> UInt32? {
        guard b.count - i >= 4 else { return nil }
        var v: UInt32 = 0
        for _ in 0 ..< 4 {
            let c = b[i]
            let d: UInt8
            switch c {
            case 0x30 ... 0x39: d = c - 0x30
            case 0x41 ... 0x46: d = c - 0x41 + 10
            case 0x61 ... 0x66: d = c - 0x61 + 10
            default: return nil
            }
            v = v << 4 | UInt32(d)
            i += 1
        }
        return v
    }
}

/// Writes one JSON object by hand, field by field: strings escaped as JSON says (`"`, `\` and
/// control characters), integers in decimal, bytes in base64 as JSONEncoder writes `Data`.
public struct PlainJSONWriter {
    private var bytes: [UInt8] = [UInt8(ascii: "{")]
    private var empty = true

    public init() {}

    public mutating func field(_ key: String, _ value: String?) {
        guard let value else { return }
        name(key)
        Self.string(value, into: &bytes)
    }

    public mutating func field(_ key: String, _ value: some BinaryInteger) {
        name(key)
        bytes.append(contentsOf: String(value).utf8)
    }

    public mutating func field(_ key: String, _ value: Data?) {
        field(key, value?.base64EncodedString())
    }

    public mutating func field(_ key: String, object: PlainJSONWriter) {
        name(key)
        bytes.append(contentsOf: object.done)
    }

    /// The object's text.
    public var done: [UInt8] { bytes + [UInt8(ascii: "}")] }

    private mutating func name(_ key: String) {
        if !empty { bytes.append(UInt8(ascii: ",")) }
        empty = false
        Self.string(key, into: &bytes)
        bytes.append(UInt8(ascii: ":"))
    }

    static func string(_ s: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for c in s.utf8 {
            switch c {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                out.append(UInt8(ascii: "\\")); out.append(c)
            case 0 ..< 0x20:
                let hex = Array("0123456789abcdef".utf8)
                out.append(contentsOf: Array("\\u00".utf8)); out.append(hex[Int(c >> 4)]); out.append(hex[Int(c & 15)])
            default:
                out.append(c)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}
