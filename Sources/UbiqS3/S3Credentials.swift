import Foundation

/// An access key pair (and a session token for temporary credentials). Its description
/// never shows the secret.
public struct S3Credentials: Sendable, CustomStringConvertible {
    public var accessKey: String
    public var secretKey: String
    public var sessionToken: String?
    /// Where they came from, for messages: "environment" or "~/.aws/credentials [profile]".
    public var source: String

    public init(accessKey: String, secretKey: String, sessionToken: String? = nil, source: String = "given") {
        self.accessKey = accessKey; self.secretKey = secretKey; self.sessionToken = sessionToken; self.source = source
    }

    public var description: String { "access key \(accessKey) from \(source)" }

    public struct Missing: Error, CustomStringConvertible {
        public let description: String
    }

    /// The standard AWS places, in the standard order: AWS_ACCESS_KEY_ID and
    /// AWS_SECRET_ACCESS_KEY (with AWS_SESSION_TOKEN); then the shared credentials file
    /// (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials), profile AWS_PROFILE or `default`.
    /// `environment` and `home` are the caller's (the CLI passes the process's).
    public static func resolve(environment env: [String: String], home: String) throws -> S3Credentials {
        if let key = env["AWS_ACCESS_KEY_ID"], !key.isEmpty {
            guard let secret = env["AWS_SECRET_ACCESS_KEY"], !secret.isEmpty else {
                throw Missing(description: "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not")
            }
            let token = env["AWS_SESSION_TOKEN"].flatMap { $0.isEmpty ? nil : $0 }
            return S3Credentials(accessKey: key, secretKey: secret, sessionToken: token, source: "environment")
        }
        let file = env["AWS_SHARED_CREDENTIALS_FILE"].flatMap { $0.isEmpty ? nil : $0 } ?? home + "/.aws/credentials"
        let profile = env["AWS_PROFILE"].flatMap { $0.isEmpty ? nil : $0 } ?? "default"
        guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
            throw Missing(description: "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or write \(file)")
        }
        let sections = parseINI(text)
        guard let values = sections[profile] else {
            throw Missing(description: "no profile [\(profile)] in \(file)")
        }
        guard let key = values["aws_access_key_id"], let secret = values["aws_secret_access_key"] else {
            throw Missing(description: "profile [\(profile)] in \(file) lacks aws_access_key_id or aws_secret_access_key")
        }
        return S3Credentials(accessKey: key, secretKey: secret, sessionToken: values["aws_session_token"],
                             source: "\(file) [\(profile)]")
    }

    /// `[section]` then `name = value` lines; `#` and `;` start comments.
    static func parseINI(_ text: String) -> [String: [String: String]] {
        var out: [String: [String: String]] = [:]
        var section: String?
        for raw in text.split(whereSeparator: \.isNewline) {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") && line.hasSuffix("]") {
                var name = String(line.dropFirst().dropLast()).trimmingCharacters(in: .whitespaces)
                // ~/.aws/config names them "profile NAME"; the credentials file plain NAME.
                if name.hasPrefix("profile ") { name = String(name.dropFirst(8)).trimmingCharacters(in: .whitespaces) }
                section = name
                out[name, default: [:]] = out[name] ?? [:]
                continue
            }
            guard let section, let eq = line.firstIndex(of: "=") else { continue }
            let name = line[..<eq].trimmingCharacters(in: .whitespaces).lowercased()
            let value = line[line.index(after: eq)...].trimmingCharacters(in: .whitespaces)
            out[section]?[name] = value
        }
        return out
    }
}
