//! ferry's reserved names, the one place they are made and recognised
//! (local copies, S3 downloads, bisync): `.ferry-tmp-<16 hex>.~ferry~` for
//! a file being written, `.ferry-part-<16 hex>.~ferry~` for a resumable
//! partial download. No user picks such a name by accident; docs/CLI.md
//! reserves them. Anything else, `.ferry-tmp.x` included, is a user's file.
const TEMP_HEAD: &[u8] = b".ferry-tmp-";
const PART_HEAD: &[u8] = b".ferry-part-";
/// The rollback record of a file being appended to in place
/// ([`crate::delta::append`]): `.ferry-undo-<16 hex>.~ferry~`.
const UNDO_HEAD: &[u8] = b".ferry-undo-";
const RESERVED_TAIL: &[u8] = b".~ferry~";
/// Length of a temporary's name.
pub const RESERVED_LEN: usize = TEMP_HEAD.len() + 16 + RESERVED_TAIL.len();

/// The temporary name with identifier `id` (NUL-terminated in a fixed
/// buffer: made on the hot path of every replaced file).
pub fn temp_name(id: u64) -> [u8; RESERVED_LEN + 1] {
    let mut b = [0u8; RESERVED_LEN + 1];
    b[..RESERVED_LEN].copy_from_slice(&reserved(TEMP_HEAD, id));
    b
}

/// The partial download name with identifier `id` (a hash of the final name).
pub fn partial_name(id: u64) -> std::ffi::CString {
    std::ffi::CString::new(reserved(PART_HEAD, id)).expect("no NUL")
}

fn reserved(head: &[u8], id: u64) -> Vec<u8> {
    let mut b = Vec::with_capacity(head.len() + 16 + RESERVED_TAIL.len());
    b.extend_from_slice(head);
    b.extend_from_slice(format!("{id:016x}").as_bytes());
    b.extend_from_slice(RESERVED_TAIL);
    b
}

fn is_reserved(name: &[u8], head: &[u8]) -> bool {
    name.len() == head.len() + 16 + RESERVED_TAIL.len()
        && name.starts_with(head)
        && name.ends_with(RESERVED_TAIL)
        && name[head.len()..head.len() + 16]
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// True for ferry's reserved names (temporaries, partial downloads and
/// rollback records): never synced, and in a destination removed as
/// leftovers of a killed run (a local store rolls back what a record
/// names and hides the record while it lists).
pub fn is_temp_name(name: &[u8]) -> bool {
    is_reserved(name, TEMP_HEAD) || is_reserved(name, PART_HEAD) || is_undo_name(name)
}

/// The rollback record's name of an append in place to file `name` (one
/// per file: its id is a hash of the name).
pub fn undo_name(name: &[u8]) -> std::ffi::CString {
    let h = blake3::hash(name);
    let id = u64::from_le_bytes(h.as_bytes()[..8].try_into().expect("8 bytes"));
    std::ffi::CString::new(reserved(UNDO_HEAD, id)).expect("no NUL")
}

/// True for a rollback record's name ([`undo_name`]).
pub fn is_undo_name(name: &[u8]) -> bool {
    is_reserved(name, UNDO_HEAD)
}

/// True for partial downloads kept for resuming.
pub fn is_partial_name(name: &[u8]) -> bool {
    is_reserved(name, PART_HEAD)
}

/// True for the name older versions gave partial downloads,
/// `.ferry-tmp.part.<16 hex>`: ferry's own only when the file also carries
/// the `user.ferry.partial` attribute (see [`PosixStore::is_own_legacy_partial`](crate::store::PosixStore::is_own_legacy_partial)).
pub fn is_legacy_partial_name(name: &[u8]) -> bool {
    const HEAD: &[u8] = b".ferry-tmp.part.";
    name.len() == HEAD.len() + 16
        && name.starts_with(HEAD)
        && name[HEAD.len()..]
            .iter()
            .all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'))
}

/// How long an unused partial download is kept.
pub const PARTIAL_KEEP_SECS: i64 = 7 * 24 * 3600;
