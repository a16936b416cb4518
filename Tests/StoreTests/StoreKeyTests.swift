import Testing
@testable import UbiqStore

/// What a key may be (every key of every listing is checked so): each rule, and the reason
/// given when one is broken.
@Suite struct StoreKeyTests {
    static func reason(_ key: String) -> String? {
        do { try StoreKey.validate(key); return nil } catch StoreError.invalidKey(_, let reason) { return reason } catch { return "\(error)" }
    }

    @Test func keysThatAreKeys() {
        let segment = String(repeating: "s", count: StoreKey.maxSegmentBytes)
        let long = Array(repeating: segment, count: 16).joined(separator: "/")  // 4,095 bytes
        for key in ["a", "a/", "a/b", "a/b/", "...", ".a", "a.", "..a", "a/.../b", ".x/", "é/ü", "日本/語", segment, segment + "/",
                    long, "a b/ c ", "-/_/~"] {
            #expect(Self.reason(key) == nil, "\(key.prefix(40).debugDescription)")
        }
    }

    @Test func keysThatAreNot() {
        let segment = String(repeating: "s", count: StoreKey.maxSegmentBytes + 1)
        let cases: [(String, String)] = [
            ("", "empty"), ("/", "empty"),
            ("//", "empty segment"), ("a//b", "empty segment"), ("/a", "empty segment"), ("a//", "empty segment"),
            (".", "dot segment"), ("..", "dot segment"), ("../", "dot segment"), ("a/./b", "dot segment"), ("a/..", "dot segment"),
            ("./a", "dot segment"), ("a/../", "dot segment"),
            ("a\0b", "contains NUL"), ("\0", "contains NUL"),
            (segment, "segment too long"), ("a/" + segment + "/b", "segment too long"),
            (String(repeating: "a/", count: StoreKey.maxKeyBytes / 2 + 1), "too long"),
            // Checked in this order: emptiness, length, NUL, then each segment from the first.
            ("a\0//", "contains NUL"), ("a//./", "empty segment"), ("./a//", "dot segment"),
        ]
        for (key, reason) in cases {
            #expect(Self.reason(key) == reason, "\(key.prefix(40).debugDescription)")
        }
    }
}
