import Foundation
import Logging

/// Log lines kept in memory (and printed, as the default handler would).
public final class LogLines: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String] = []
    public init() {}
    public var all: [String] { lock.lock(); defer { lock.unlock() }; return lines }
    public func count(_ containing: String) -> Int { all.filter { $0.contains(containing) }.count }
    public func add(_ line: String) { lock.lock(); lines.append(line); lock.unlock(); print(line) }

    public struct Handler: LogHandler {
        let lines: LogLines
        public var logLevel: Logger.Level = .info
        public var metadata: Logger.Metadata = [:]
        public init(lines: LogLines) { self.lines = lines }
        public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        public func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String,
                 file: String, function: String, line: UInt) {
            lines.add("\(level) test: \(message)")
        }
    }
}
