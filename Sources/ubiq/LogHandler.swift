import Foundation
import Logging

/// Appends log lines to a file (the daemon's log in its state directory), and
/// to standard error when running in the foreground on a terminal.
///
/// The log is rotated: past `maxBytes` (10 MiB; `UBIQ_LOG_MAX_BYTES`) it becomes `ubiq.log.1`
/// (the one before is dropped) and a new `ubiq.log` starts, so it never grows without end.
struct FileLogHandler: LogHandler {
    final class Sink: @unchecked Sendable {
        let lock = NSLock()
        let path: String
        private(set) var fd: Int32
        let echo: Bool
        let maxBytes: Int64
        /// Standard error goes to the log too (a detached daemon): kept so after a rotation.
        var stderrToo = false {
            didSet { lock.lock(); defer { lock.unlock() }; if stderrToo && fd >= 0 { dup2(fd, 2) } }
        }
        private var size: Int64

        init(path: String, echo: Bool,
             maxBytes: Int64 = ProcessInfo.processInfo.environment["UBIQ_LOG_MAX_BYTES"].flatMap { Int64($0) } ?? 10 << 20) {
            self.path = path
            fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            self.echo = echo
            self.maxBytes = max(4096, maxBytes)
            var st = stat()
            size = fd >= 0 && fstat(fd, &st) == 0 ? Int64(st.st_size) : 0
        }

        func write(_ line: String) {
            lock.lock(); defer { lock.unlock() }
            let bytes = Array(line.utf8)
            if size + Int64(bytes.count) > maxBytes { rotate() }
            if fd >= 0 { _ = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) } }
            size += Int64(bytes.count)
            if echo { _ = bytes.withUnsafeBytes { Glibc.write(2, $0.baseAddress, $0.count) } }
        }

        private func rotate() {
            rename(path, path + ".1")
            let new = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
            guard new >= 0 else { return }  // keep writing where it was
            if fd >= 0 { close(fd) }
            fd = new
            size = 0
            if stderrToo { dup2(fd, 2) }
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
