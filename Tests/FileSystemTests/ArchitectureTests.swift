import Foundation
import Testing

/// docs/architecture.md's table of targets, held to Package.swift, and Package.swift to the
/// imports in Sources/: an import that is not declared builds only by luck (another target
/// brought it in), and a table that drifts sends a newcomer the wrong way.
@Suite struct ArchitectureTests {
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()

    static func text(_ path: String) throws -> String {
        try String(contentsOf: root.appendingPathComponent(path), encoding: .utf8)
    }

    /// Each product target of Package.swift (a folder under Sources/, or a system library) and
    /// the targets of this package it depends on.
    static func declared() throws -> [String: Set<String>] {
        let package = try text("Package.swift")
        let target = try Regex(#"\.(target|executableTarget|systemLibrary)\(name: "([A-Za-z0-9]+)"(?:, dependencies: \[([^\]]*)\])?"#)
        var found: [String: String] = [:]
        var system: Set<String> = []
        for m in package.matches(of: target) {
            let name = String(m.output[2].substring ?? "")
            found[name] = m.output[3].substring.map(String.init) ?? ""
            if m.output[1].substring == "systemLibrary" { system.insert(name) }
        }
        let names = Set(found.keys)
        let quoted = try Regex(#""([A-Za-z0-9]+)""#)
        var out: [String: Set<String>] = [:]
        for (name, deps) in found
        where system.contains(name) || FileManager.default.fileExists(atPath: root.appendingPathComponent("Sources/\(name)").path) {
            out[name] = Set(deps.matches(of: quoted).map { String($0.output[1].substring ?? "") }.filter(names.contains))
        }
        return out
    }

    /// The targets of this package that the Swift files of `Sources/<target>` import.
    static func imported(by target: String, among names: Set<String>) throws -> Set<String> {
        let dir = root.appendingPathComponent("Sources/\(target)")
        let line = try Regex(#"^(?:@[A-Za-z_]+(?:\([^)]*\))? )*import (?:[a-z]+ )?([A-Za-z0-9_]+)"#).anchorsMatchLineEndings()
        var out: Set<String> = []
        for case let file as String in FileManager.default.enumerator(atPath: dir.path) ?? FileManager.DirectoryEnumerator()
        where file.hasSuffix(".swift") {
            let source = try String(contentsOf: dir.appendingPathComponent(file), encoding: .utf8)
            for m in source.matches(of: line) {
                let module = String(m.output[1].substring ?? "")
                if names.contains(module) { out.insert(module) }
            }
        }
        return out
    }

    /// The table's rows in order: the targets each names, and the targets its last cell names.
    static func table() throws -> [(targets: [String], dependsOn: Set<String>)] {
        let doc = try text("docs/architecture.md")
        guard let start = doc.range(of: "## Targets") else { return [] }
        let name = try Regex("`([A-Za-z0-9]+)`")
        var rows: [(targets: [String], dependsOn: Set<String>)] = []
        for line in doc[start.upperBound...].split(separator: "\n", omittingEmptySubsequences: false).drop(while: { !$0.hasPrefix("|") }) {
            guard line.hasPrefix("|") else { break }
            let cells = line.split(separator: "|", omittingEmptySubsequences: false).map { $0.trimmingCharacters(in: .whitespaces) }
            guard cells.count >= 4, cells[1].hasPrefix("`") else { continue }
            let targets = cells[1].matches(of: name).map { String($0.output[1].substring ?? "") }
            let deps = Set(cells[cells.count - 2].matches(of: name).map { String($0.output[1].substring ?? "") })
            rows.append((targets, deps))
        }
        return rows
    }

    @Test func everyImportOfAnotherTargetIsDeclared() throws {
        let declared = try Self.declared()
        try #require(declared.count >= 10, "the targets of Package.swift: \(declared.keys.sorted())")
        let names = Set(declared.keys)
        for (target, deps) in declared {
            let undeclared = try Self.imported(by: target, among: names).subtracting(deps).subtracting([target])
            #expect(undeclared.isEmpty, "\(target) imports \(undeclared.sorted()), which Package.swift does not give it")
        }
    }

    @Test func theTableOfTargetsIsPackageSwiftAndPointsDown() throws {
        let declared = try Self.declared()
        let rows = try Self.table()
        let inTable = rows.flatMap(\.targets)
        #expect(Set(inTable) == Set(declared.keys), "the table has \(inTable.sorted()), Package.swift \(declared.keys.sorted())")
        for (i, row) in rows.enumerated() {
            let fromPackage = row.targets.reduce(into: Set<String>()) { $0.formUnion(declared[$1] ?? []) }
            #expect(row.dependsOn == fromPackage,
                    "\(row.targets): the table says \(row.dependsOn.sorted()), Package.swift \(fromPackage.sorted())")
            for dep in fromPackage {
                let at = rows.firstIndex { $0.targets.contains(dep) } ?? -1
                #expect(at >= i, "\(row.targets) depends on \(dep), which is not below it in the table")
            }
        }
    }
}
