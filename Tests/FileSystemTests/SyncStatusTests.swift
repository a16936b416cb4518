import Foundation
import Testing
import UbiqState

/// One vocabulary of status words: the type, its rules, and what docs/status.md says of them.
@Suite struct SyncStatusTests {
    static let doc: String = {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return (try? String(contentsOf: root.appendingPathComponent("docs/status.md"), encoding: .utf8)) ?? ""
    }()

    /// The backticked words in the last cell of the doc's table row that starts with `row`.
    func words(inRow row: String) -> [String] {
        guard let line = Self.doc.split(separator: "\n").first(where: { $0.hasPrefix(row) }) else { return [] }
        let cell = line.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }.last { !$0.isEmpty } ?? ""
        return cell.components(separatedBy: "`").enumerated().filter { $0.offset % 2 == 1 }.map(\.element)
    }

    @Test func theDocListsExactlyTheWordsMostUrgentFirst() {
        let all = SyncStatus.allCases.map(\.rawValue)
        let attribute = words(inRow: "| `user.ubiq.status` | one word")
        #expect(attribute == all.reversed(), "the user.ubiq.status row: \(attribute)")
        let query = words(inRow: "| `--status S,...` |")
        #expect(Set(query) == Set(all) && query.count == all.count, "the --status row: \(query)")
        // Each word is explained in the paragraph of status words.
        let start = Self.doc.range(of: "`status` words:")
        #expect(start != nil)
        if let start {
            let paragraph = Self.doc[start.upperBound...].prefix { $0 != "|" }.components(separatedBy: "\n\n")[0]
            for w in all { #expect(paragraph.contains("`\(w)`"), "\(w) is not explained in docs/status.md") }
        }
    }

    @Test func theRulesGoMostUrgentFirst() {
        var f = SyncStatus.Facts()
        #expect(SyncStatus.of(f) == .current)
        f.placeholder = true
        #expect(SyncStatus.of(f) == .placeholder)
        f.inStore = false
        #expect(SyncStatus.of(f) == .local)
        f.downloading = true
        #expect(SyncStatus.of(f) == .downloading)
        f.uploadFailed = true
        #expect(SyncStatus.of(f) == .error)
        f.queued = true
        #expect(SyncStatus.of(f) == .uploading)  // tried again: still uploading
        f.conflict = true
        #expect(SyncStatus.of(f) == .conflict)
        // Kept here by design, unless a download failed.
        var kept = SyncStatus.Facts()
        kept.localOnly = true
        kept.uploadFailed = true
        #expect(SyncStatus.of(kept) == .local)
        kept.downloadFailed = true
        #expect(SyncStatus.of(kept) == .error)
        // The root is never "not in the store".
        var root = SyncStatus.Facts()
        root.inStore = false
        root.isRoot = true
        #expect(SyncStatus.of(root) == .current)
        // A folder shows the most urgent word under it: the order of the cases.
        #expect(SyncStatus.allCases.sorted() == SyncStatus.allCases)
        #expect(SyncStatus.conflict > SyncStatus.error && SyncStatus.error > SyncStatus.uploading && SyncStatus.placeholder > SyncStatus.current)
    }

    /// The query's SQL is made from the same rules, in the same order, save the one only
    /// memory can tell (a download under way).
    @Test func theQuerysSQLFollowsTheRules() {
        let sql = SyncStatus.sqlCase
        var at = sql.startIndex
        for w in ["conflict", "uploading", "local", "error", "local", "placeholder"] {
            let r = sql.range(of: "THEN '\(w)'", range: at ..< sql.endIndex)
            #expect(r != nil, "\(w) in \(sql)")
            if let r { at = r.upperBound }
        }
        #expect(!sql.contains("'downloading'") && sql.hasSuffix("ELSE 'current' END"))
    }
}
