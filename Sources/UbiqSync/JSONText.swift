import Foundation

/// `value` as one line of JSON, keys sorted and slashes as they are (so a line is stable and
/// paths read as paths): what the control socket sends, `ubiq … --json` prints, and a `json`
/// value of the key-value store is kept as. Nil when `value` cannot be encoded.
public func jsonText<T: Encodable>(_ value: T) -> String? {
    let e = JSONEncoder()
    e.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    return (try? e.encode(value)).map { String(decoding: $0, as: UTF8.self) }
}
