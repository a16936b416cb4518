import Foundation
import Testing
import TestSupport
@testable import UbiqS3
@testable import UbiqStore

/// `PlainJSON` is a shortcut past JSONDecoder for metadata and snapshot entries: whatever it
/// reads must be what JSONDecoder reads of the same text, and whatever it does not read goes
/// to JSONDecoder. Checked on random metadata as this client writes them, and on those texts
/// broken at random (another device, a newer client or a hostile one may write anything).
@Suite struct PlainJSONTests {
    static let pieces = ["a", "é", "e\u{301}", "\"", "\\", "/", "\n", "\u{0}", "\u{1F}", "😀", "\u{FFFF}", " ", "{", "}", "[", ":", ","]

    static func text(_ rng: inout SplitMix, max: Int = 6) -> String {
        (0 ..< Int.random(in: 0 ... max, using: &rng)).map { _ in pieces.randomElement(using: &rng)! }.joined()
    }

    static func metadata(_ rng: inout SplitMix) -> ObjectMetadata {
        let kinds: [ObjectKind] = [.file, .directory, .symlink, .fifo, .socket, .charDevice, .blockDevice]
        var m = ObjectMetadata(kind: kinds.randomElement(using: &rng)!, mode: UInt32.random(in: 0 ... 0o7777, using: &rng),
                               uid: UInt32.random(in: 0 ... .max, using: &rng), gid: UInt32.random(in: 0 ... 70000, using: &rng),
                               mtimeNs: Int64.random(in: .min ... .max, using: &rng), rdev: UInt64.random(in: 0 ... .max, using: &rng))
        if Bool.random(using: &rng) { m.target = Data((0 ..< Int.random(in: 0 ... 40, using: &rng)).map { _ in UInt8.random(in: 0 ... 255, using: &rng) }) }
        for _ in 0 ..< Int.random(in: 0 ... 3, using: &rng) {
            m.xattrs["user." + text(&rng)] = Data((0 ..< Int.random(in: 0 ... 9, using: &rng)).map { _ in UInt8.random(in: 0 ... 255, using: &rng) })
        }
        if Bool.random(using: &rng) { m.origin = text(&rng) }
        if Bool.random(using: &rng) { m.device = text(&rng) }
        if Bool.random(using: &rng) { m.sha256 = String(repeating: "ab", count: Int.random(in: 0 ... 32, using: &rng)) }
        if Bool.random(using: &rng) { m.fileID = ObjectMetadata.newFileID() }
        return m
    }

    /// A text broken at random: bytes changed, dropped or doubled, and pieces of JSON put in.
    static func broken(_ data: Data, _ rng: inout SplitMix) -> Data {
        var b = [UInt8](data)
        let inserts = ["-0", "01", "1.5", "1e3", "null", "true", "\"kind\":\"file\",", "\\ud800", "\\udc00", "\\u00e9", "[1,2]",
                       "{}", "\u{FF}", "\"mode\":1,", "   ", "99999999999999999999"]
        for _ in 0 ..< Int.random(in: 1 ... 3, using: &rng) where !b.isEmpty {
            let at = Int.random(in: 0 ..< b.count, using: &rng)
            switch Int.random(in: 0 ..< 4, using: &rng) {
            case 0: b[at] = UInt8.random(in: 0 ... 255, using: &rng)
            case 1: b.remove(at: at)
            case 2: b.insert(b[at], at: at)
            default: b.insert(contentsOf: Array(inserts.randomElement(using: &rng)!.utf8), at: at)
            }
        }
        return Data(b)
    }

    static func decoded(_ data: Data) -> ObjectMetadata? { try? JSONDecoder().decode(ObjectMetadata.self, from: data) }

    @Test func metadataAsThisClientWritesThemAreReadPlainlyAndAlike() throws {
        var rng = SplitMix(state: 20261129)
        for round in 0 ..< 3000 {
            let m = Self.metadata(&rng)
            let encoder = JSONEncoder()
            if round % 2 == 0 { encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes] }
            let data = try encoder.encode(m)
            let plain = PlainJSON.parse(data)?.object.flatMap(ObjectMetadata.plain)
            #expect(plain == m, "\(String(decoding: data, as: UTF8.self))")
            #expect(try ObjectMetadata.read(json: data) == Self.decoded(data))
        }
    }

    /// Metadata written by hand (`ObjectMetadata.json`) read back as they were, by both readers.
    @Test func metadataWrittenByHandReadBackAsTheyWere() throws {
        var rng = SplitMix(state: 11)
        for _ in 0 ..< 3000 {
            let m = Self.metadata(&rng)
            #expect(try JSONDecoder().decode(ObjectMetadata.self, from: m.json) == m, "\(String(decoding: m.json, as: UTF8.self))")
            #expect(PlainJSON.parse(m.json)?.object.flatMap(ObjectMetadata.plain) == m)
        }
    }

    @Test func brokenMetadataReadPlainlyAreWhatJSONDecoderReads() throws {
        var rng = SplitMix(state: 7)
        var plainly = 0
        for _ in 0 ..< 20000 {
            let data = Self.broken(try JSONEncoder().encode(Self.metadata(&rng)), &rng)
            let viaDecoder = Self.decoded(data)
            if let plain = PlainJSON.parse(data)?.object.flatMap(ObjectMetadata.plain) {
                plainly += 1
                #expect(plain == viaDecoder, "\(String(decoding: data, as: UTF8.self))")
            }
            #expect((try? ObjectMetadata.read(json: data)) == viaDecoder)
        }
        #expect(plainly > 1000)  // the texts still read plainly are many: the comparison means something
    }

    @Test func whatIsNotPlainJSONIsLeftToJSONDecoder() {
        func parse(_ s: String) -> PlainJSON.Value? { PlainJSON.parse(Data(s.utf8)) }
        #expect(parse(#" { "a" : [1, -2, true, false, null, "x\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"] } "#)
            == .object(["a": .array([.integer("1"), .integer("-2"), .bool(true), .bool(false), .null,
                                     .string("x\"\\/\u{8}\u{C}\n\r\té😀")])]))
        for bad in ["-0", "01", "1.0", "1e2", "-", "{\"a\":1,\"a\":2}", "{\"é\":1,\"e\u{301}\":2}", "\"\\ud800\"", "\"\\udc00x\"",
                    "\"\u{1}\"", "\"\\x\"", "{\"a\":1", "[1,]", "{,}", "1 2", "tru", "nul", "\"abc", "",
                    String(repeating: "[", count: 20) + String(repeating: "]", count: 20)] {
            #expect(parse(bad) == nil, "\(bad.debugDescription)")
        }
        #expect(PlainJSON.parse(Data([0x22, 0xFF, 0x22])) == nil)  // not UTF-8
        // Fields not as this client writes them: JSONDecoder reads them, with what it says of them.
        for odd in [#"{"kind":"whiteout"}"#, #"{"mode":-5,"kind":"file"}"#, #"{"kind":"file","fileID":"not an id!"}"#,
                    #"{"kind":"file","target":"not base64"}"#, #"{"mode":1}"#] {
            let data = Data(odd.utf8)
            #expect(PlainJSON.parse(data)?.object.flatMap(ObjectMetadata.plain) == nil, "\(odd)")
            let read = try? ObjectMetadata.read(json: data)
            #expect(read == Self.decoded(data) && read?.issues.isEmpty == false, "\(odd)")
        }
    }

    @Test func snapshotEntriesAreReadAlike() throws {
        var rng = SplitMix(state: 99)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let decoder = JSONDecoder()
        func read(_ data: Data) -> S3Snapshots.Entry? {
            data.withUnsafeBytes { S3Snapshots.Entry.read($0.bindMemory(to: UInt8.self), decoder) }
        }
        func same(_ a: S3Snapshots.Entry?, _ b: S3Snapshots.Entry?) -> Bool {
            guard let a, let b else { return a == nil && b == nil }
            return (a.key, a.stamp, a.version, a.size, a.tag, a.foreign) == (b.key, b.stamp, b.version, b.size, b.tag, b.foreign)
                && a.meta == b.meta
        }
        for round in 0 ..< 5000 {
            let e = S3Snapshots.Entry(key: "d/" + Self.text(&rng), stamp: "\"e\"|1|\(round)", version: "\"e\"", size: Int64(round),
                                      tag: Bool.random(using: &rng) ? "\"e\"" : nil, meta: Self.metadata(&rng),
                                      foreign: [nil, true, false].randomElement(using: &rng)!)
            let data = try encoder.encode(e)
            #expect(same(read(data), e))
            let bad = Self.broken(data, &rng)
            #expect(same(read(bad), try? decoder.decode(S3Snapshots.Entry.self, from: bad)), "\(String(decoding: bad, as: UTF8.self))")
        }
    }
}
