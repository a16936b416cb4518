import Foundation
import GRDB

// The schema, one named migration a change. Never edit one that shipped: databases have run it;
// add the next.
extension LocalState {
    static var migrator: DatabaseMigrator {
        var m = DatabaseMigrator()
        m.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
                CREATE TABLE inodes (
                  ino INTEGER PRIMARY KEY, type INTEGER NOT NULL, perm INTEGER NOT NULL,
                  uid INTEGER NOT NULL, gid INTEGER NOT NULL, size INTEGER NOT NULL,
                  atime INTEGER NOT NULL, mtime INTEGER NOT NULL, ctime INTEGER NOT NULL,
                  rdev INTEGER NOT NULL, target BLOB, present INTEGER NOT NULL,
                  content_gen INTEGER NOT NULL, meta_gen INTEGER NOT NULL,
                  uploaded_content_gen INTEGER NOT NULL DEFAULT 0,
                  uploaded_meta_gen INTEGER NOT NULL DEFAULT 0,
                  upload_error TEXT);
                CREATE TABLE entries (
                  id INTEGER PRIMARY KEY, parent INTEGER NOT NULL, name BLOB NOT NULL,
                  ino INTEGER NOT NULL, remote_key TEXT, remote_version TEXT,
                  UNIQUE (parent, name));
                CREATE INDEX entries_ino ON entries (ino);
                CREATE INDEX entries_remote ON entries (remote_key);
                CREATE TABLE xattrs (ino INTEGER NOT NULL, name BLOB NOT NULL, value BLOB NOT NULL,
                  PRIMARY KEY (ino, name));
                CREATE TABLE outbox (ino INTEGER PRIMARY KEY, seq INTEGER NOT NULL,
                  not_before REAL NOT NULL, attempts INTEGER NOT NULL DEFAULT 0);
                CREATE TABLE tombstones (id INTEGER PRIMARY KEY, remote_key TEXT NOT NULL,
                  remote_version TEXT);
                """)
        }
        m.registerMigration("v2: indexes for tombstones and outbox order") { db in
            try db.execute(sql: """
                CREATE INDEX tombstones_key ON tombstones (remote_key);
                CREATE INDEX outbox_seq ON outbox (seq);
                DROP INDEX entries_remote;
                """)
        }
        m.registerMigration("v3: pins") { db in
            try db.execute(sql: "ALTER TABLE inodes ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0")
        }
        m.registerMigration("v4: partial downloads") { db in
            try db.execute(sql: """
                CREATE TABLE downloads (ino INTEGER PRIMARY KEY, version TEXT NOT NULL,
                  chunk_size INTEGER NOT NULL, chunks BLOB NOT NULL)
                """)
        }
        m.registerMigration("v5: change feed") { db in
            try db.execute(sql: """
                ALTER TABLE entries ADD COLUMN remote_tag TEXT;
                CREATE INDEX entries_remote_key ON entries (remote_key) WHERE remote_key IS NOT NULL;
                CREATE TABLE feed_pending (key TEXT PRIMARY KEY);
                """)
        }
        m.registerMigration("v6: conflicts as a column; indexes for status summaries") { db in
            try db.execute(sql: """
                ALTER TABLE inodes ADD COLUMN upload_conflict INTEGER NOT NULL DEFAULT 0;
                UPDATE inodes SET upload_conflict = 1, upload_error = substr(upload_error, 11)
                  WHERE upload_error LIKE 'conflict: %';
                CREATE INDEX inodes_upload_errors ON inodes (ino) WHERE upload_error IS NOT NULL;
                CREATE INDEX entries_not_in_store ON entries (ino) WHERE remote_key IS NULL;
                """)
        }
        m.registerMigration("v7: key-value store") { db in
            try db.execute(sql: """
                CREATE TABLE kv (key TEXT PRIMARY KEY, doc BLOB NOT NULL, pending INTEGER NOT NULL DEFAULT 0);
                """)
        }
        m.registerMigration("v8: content digests") { db in
            try db.execute(sql: "ALTER TABLE entries ADD COLUMN remote_digest TEXT")
        }
        m.registerMigration("v9: where an unrecorded upload went") { db in
            try db.execute(sql: "ALTER TABLE outbox ADD COLUMN sent_key TEXT")
        }
        m.registerMigration("v10: entries by content, for moves made elsewhere") { db in
            try db.execute(sql: """
                CREATE INDEX entries_remote_tag ON entries (remote_tag, name) WHERE remote_tag IS NOT NULL;
                CREATE INDEX entries_remote_digest ON entries (remote_digest, name) WHERE remote_digest IS NOT NULL;
                """)
        }
        m.registerMigration("v11: items' ids in the store, for moves made elsewhere") { db in
            try db.execute(sql: """
                ALTER TABLE entries ADD COLUMN remote_file_id TEXT;
                CREATE INDEX entries_remote_file_id ON entries (remote_file_id) WHERE remote_file_id IS NOT NULL;
                """)
        }
        return m
    }
}
