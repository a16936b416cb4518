import Foundation
import Logging

/// Appends log lines to a file (the daemon's log in its state directory), and
/// to standard error when running in the foreground on a terminal.
struct FileLogHandler: LogHandler {
    final class Sink: @unchecked Sendable {
        let lock = NSLock()
        let fd: Int32
        let echo: Bool
        init(path: String, echo: Bool) {
            fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            self.echo = echo
        }
        func write(_ line: String) {
            lock.lock(); defer { lock.unlock() }
            let bytes = Array(line.utf8)
            if fd >= 0 { _ = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) } }
            if echo { _ = bytes.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) } }
        }
    }

    let sink: Sink
    let label: String
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String,
             file: String, function: String, line: UInt) {
        let ts = ISO8601DateFormatter.string(from: Date(), timeZone: .gmt, formatOptions: [.withInternetDateTime, .withFractionalSeconds])
        sink.write("\(ts) \(level) \(label): \(message)\n")
    }
}
