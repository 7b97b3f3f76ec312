//! The wire protocol between [`SshStore`](crate::SshStore) and `ferry serve`.
//!
//! Both ends first write a fixed hello (`FERRY-SERVE\n`, the protocol
//! version as a little-endian `u32`, the ferry version as text); a
//! different protocol ends the session with one line naming both versions.
//! Then every message is a frame: `u32` length (little-endian, of what
//! follows), a `u64` request id, and the message encoded with postcard
//! (serde, varints, byte strings borrowed from the frame on decoding).
//! Replies carry the id of their request, so any number of requests are in
//! flight over the one stream and are answered in any order. Id 0 is a
//! message that gets no reply (closing a handle, a write of a big file,
//! an abort); the errors of those writes come back on the file's commit.
//! Handles (directories, open files, files being written) are numbered by
//! the client, so a request naming a new handle needs no answer first.
//! [`Req::Watch`] is answered by any number of replies with its id (a
//! stream, [`Conn::stream`](crate::conn::Conn::stream)), until the
//! connection closes. A reply of id 0 is a heartbeat ([`Req::KeepAlive`]).

use std::io::{self, Read, Write};

use ferry_engine::entry::{Kind, Meta};
use ferry_engine::store::{MetaChange, Planned};
use ferry_engine::xattr::{XattrSel, Xattrs};
use serde::{Deserialize, Serialize};

mod frame;

pub use frame::*;

/// The first flight's numbers (`conn/open.rs`, and a serve that answers
/// it unasked, `serve/push.rs`): the ids of the walked tree's `StatRoot`
/// and root `List`, the handle the tree is opened as, the id of the round
/// trip's first measure, then three numbers for each of at most
/// [`FIRST_DIRS`] directories (handle, id of its open, of its listing).
pub const FIRST_STAT: u64 = 1;
/// See [`FIRST_STAT`].
pub const FIRST_LIST: u64 = 2;
/// See [`FIRST_STAT`].
pub const FIRST_DIR: u64 = 3;
/// See [`FIRST_STAT`].
pub const FIRST_PING: u64 = 4;
/// See [`FIRST_STAT`].
pub const FIRST_DIRS: usize = 256;
/// The id of the first flight's `Info`.
pub const INFO_ID: u64 = u64::MAX;

/// The protocol version both ends must speak.
pub const PROTOCOL: u32 = 18;
/// The hello's first bytes.
const MAGIC: &[u8; 12] = b"FERRY-SERVE\n";
/// Largest frame accepted (a whole small file, a big directory's listing).
pub const MAX_FRAME: usize = 1 << 30;
/// Files up to this size travel whole: returned with their open, sent with
/// their commit.
pub const INLINE_MAX: u64 = 256 << 10;
/// Bytes per message of a big file's content.
pub const CHUNK: usize = 1 << 20;

/// The ferry version of this build.
pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Write this end's hello.
pub fn write_hello(w: &mut impl Write) -> io::Result<()> {
    let v = version().as_bytes();
    let mut b = Vec::with_capacity(MAGIC.len() + 5 + v.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&PROTOCOL.to_le_bytes());
    b.push(v.len() as u8);
    b.extend_from_slice(v);
    w.write_all(&b)?;
    w.flush()
}

/// What the other end said in its hello.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// A ferry speaking `protocol`, of version `version`.
    Ferry {
        /// Its protocol version.
        protocol: u32,
        /// Its ferry version.
        version: String,
    },
    /// Something else answered (the first bytes it sent).
    Other(Vec<u8>),
}

/// Read the other end's hello; `UnexpectedEof` when it closed first.
pub fn read_hello(r: &mut impl Read) -> io::Result<Hello> {
    let mut head = [0u8; MAGIC.len() + 5];
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..])? {
            0 if n == 0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            0 => return Ok(Hello::Other(head[..n].to_vec())),
            k => n += k,
        }
        if head[..n.min(MAGIC.len())] != MAGIC[..n.min(MAGIC.len())] {
            return Ok(Hello::Other(head[..n].to_vec()));
        }
    }
    let protocol = u32::from_le_bytes(head[MAGIC.len()..MAGIC.len() + 4].try_into().unwrap());
    let mut v = vec![0u8; head[MAGIC.len() + 4] as usize];
    r.read_exact(&mut v)?;
    Ok(Hello::Ferry {
        protocol,
        version: String::from_utf8_lossy(&v).into_owned(),
    })
}

/// Decode a message from a frame's bytes.
pub fn decode<'a, T: Deserialize<'a>>(b: &'a [u8]) -> io::Result<T> {
    postcard::from_bytes(b).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// [`Kind`] on the wire.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Kind")]
enum KindDef {
    File,
    Dir,
    Symlink,
    Other,
    Fifo,
    CharDev,
    BlockDev,
    Socket,
}

/// [`Meta`] on the wire: every field, so the remote end's entries are
/// exactly the local store's.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Meta")]
struct MetaDef {
    #[serde(with = "KindDef")]
    kind: Kind,
    size: u64,
    mtime_sec: i64,
    mtime_nsec: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    ino: u64,
    version: u64,
    rdev: u64,
    sparse: bool,
    nlink: u32,
    dev: u64,
    ctime: u64,
}

/// A [`Meta`] in a message.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct M(#[serde(with = "MetaDef")] pub Meta);

/// A [`Planned`] in a message: what the plan saw at a name the server is
/// to replace or remove, checked there right before the act (the same
/// check as a local run's, with the server's own `statx`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct P {
    /// The entry as listed.
    pub meta: M,
    /// The step its mtime is compared to.
    pub step: u32,
}

impl From<&Planned> for P {
    fn from(p: &Planned) -> P {
        P {
            meta: M(p.meta),
            step: p.step,
        }
    }
}

impl From<P> for Planned {
    fn from(p: P) -> Planned {
        Planned::new(&p.meta.0, p.step)
    }
}

/// What a commit may replace, as `Store::expect` says it, on the wire:
/// `None`, not said; `Some(None)`, nothing (the name was free);
/// `Some(Some(p))`, the entry planned.
pub type Expect = Option<Option<P>>;

/// [`MetaChange`] as bits: mtime 1, mode 2, owner 4.
pub fn what_bits(w: MetaChange) -> u8 {
    w.mtime as u8 | (w.mode as u8) << 1 | (w.owner as u8) << 2
}

/// The [`MetaChange`] of [`what_bits`].
pub fn what_of(b: u8) -> MetaChange {
    MetaChange {
        mtime: b & 1 != 0,
        mode: b & 2 != 0,
        owner: b & 4 != 0,
    }
}

/// [`XattrSel`] as bits: extended attributes 1, ACLs 2.
pub fn sel_bits(s: XattrSel) -> u8 {
    s.xattrs as u8 | (s.acls as u8) << 1
}

/// The [`XattrSel`] of [`sel_bits`].
pub fn sel_of(b: u8) -> XattrSel {
    XattrSel {
        xattrs: b & 1 != 0,
        acls: b & 2 != 0,
    }
}

/// One entry's attributes on the wire: (name, value) pairs, by name.
pub type Attrs<'a> = Vec<(&'a [u8], &'a [u8])>;

/// `x` on the wire.
pub fn attrs(x: &Xattrs) -> Attrs<'_> {
    x.iter().collect()
}

/// The [`Xattrs`] of wire attributes `a` (sorted, as they were sent).
pub fn xattrs_of(a: &[(&[u8], &[u8])], out: &mut Xattrs) {
    out.clear();
    for (n, v) in a {
        out.push(n, v);
    }
    out.sort();
}

/// A [`Kind`] in a message.
#[derive(Serialize, Deserialize, Clone, Copy, Debug)]
pub struct K(#[serde(with = "KindDef")] pub Kind);

/// A request (client to server). Names and paths are bytes (no NUL);
/// `dir`, `file` and `new` are handles; each variant says what it does.
#[allow(missing_docs)]
#[derive(Serialize, Deserialize, Debug)]
pub enum Req<'a> {
    /// Open (or with `create`, create) the tree at `path` as handle `dir`:
    /// [`Resp::Meta`] (`None`: missing, and nothing opened).
    Root {
        path: &'a [u8],
        dir: u64,
        create: bool,
    },
    /// Metadata of a path, following a final symlink when `follow`:
    /// [`Resp::Meta`].
    StatPath { path: &'a [u8], follow: bool },
    /// [`Resp::Meta`] of `name` in `dir`.
    Stat { dir: u64, name: &'a [u8] },
    /// The listing of `dir`: [`Resp::Listing`].
    List { dir: u64 },
    /// Open subdirectory `name` as handle `new`: [`Resp::Ok`].
    OpenDir { dir: u64, name: &'a [u8], new: u64 },
    /// Create subdirectory `name` and open it as handle `new`: [`Resp::Ok`].
    MakeDir { dir: u64, name: &'a [u8], new: u64 },
    /// Set metadata of directory `dir`: [`Resp::Ok`].
    SetDirMeta { dir: u64, meta: M, what: u8 },
    /// Forget a handle (no reply).
    Close { handle: u64 },
    /// Open file `name` as handle `file`: [`Resp::Opened`], with the
    /// attributes `xattrs` selects ([`sel_bits`]; 0: none) read from the
    /// open file. A file up to [`INLINE_MAX`] comes whole in the reply
    /// (and the handle is not kept).
    Open {
        dir: u64,
        name: &'a [u8],
        file: u64,
        xattrs: u8,
    },
    /// Open the file at `path` (as [`Req::StatPath`] names it) as handle
    /// `file`, whatever its size: [`Resp::Opened`] with no data (a big
    /// file's other connections read ranges of it).
    OpenPath { path: &'a [u8], file: u64 },
    /// Up to `len` bytes of open file `file` at `offset`: [`Resp::Data`].
    Read { file: u64, offset: u64, len: u32 },
    /// A symlink's target: [`Resp::Bytes`].
    ReadLink { dir: u64, name: &'a [u8] },
    /// A whole small file: create, write, give it the attributes `xattrs`
    /// ([`sel_bits`], attributes) if any, commit, in one: [`Resp::Ok`], or
    /// [`Resp::Bool`] `false` when committed but the filesystem refused
    /// the attributes. `replacing`: the name exists (`Store::replacing`).
    /// `expect`: what the commit may replace (`Store::expect`), checked
    /// right before the rename; else the error `changed` and nothing
    /// replaced.
    Put {
        dir: u64,
        name: &'a [u8],
        meta: M,
        fsync: bool,
        #[serde(with = "serde_bytes")]
        data: &'a [u8],
        xattrs: Option<(u8, Attrs<'a>)>,
        replacing: bool,
        expect: Expect,
    },
    /// Start writing a big file as handle `file` (no reply).
    Create {
        dir: u64,
        name: &'a [u8],
        meta: M,
        file: u64,
    },
    /// The next bytes of file `file` (no reply).
    Write {
        file: u64,
        #[serde(with = "serde_bytes")]
        data: &'a [u8],
    },
    /// Bytes of file `file` at `offset` (no reply): a file with holes is
    /// sent as its data only, then [`Req::SetLen`].
    WriteAt {
        file: u64,
        offset: u64,
        #[serde(with = "serde_bytes")]
        data: &'a [u8],
    },
    /// The size of file `file`, its end past the last data a hole (no
    /// reply).
    SetLen { file: u64, size: u64 },
    /// Finish file `file` under `name`, with attributes as [`Req::Put`]:
    /// [`Resp::Ok`] (or `Bool(false)` as there), or the first error of its
    /// creation, writes or commit. `replacing` and `expect` as there.
    Commit {
        dir: u64,
        file: u64,
        name: &'a [u8],
        meta: M,
        fsync: bool,
        xattrs: Option<(u8, Attrs<'a>)>,
        replacing: bool,
        expect: Expect,
    },
    /// Drop file `file` and its temporary (no reply).
    Abort { dir: u64, file: u64 },
    /// [`Resp::Bool`]: whether the empty file was made.
    CreateEmpty {
        dir: u64,
        name: &'a [u8],
        meta: M,
        fsync: bool,
    },
    /// [`Resp::Ok`].
    Symlink {
        dir: u64,
        name: &'a [u8],
        target: &'a [u8],
        meta: M,
    },
    /// [`Resp::Ok`].
    SetMeta {
        dir: u64,
        name: &'a [u8],
        meta: M,
        what: u8,
    },
    /// [`Resp::Count`].
    Remove {
        dir: u64,
        name: &'a [u8],
        is_dir: bool,
    },
    /// Remove `name` (not a directory) only while it is still the entry
    /// planned `at` (`Store::remove_planned`): [`Resp::Count`], or the
    /// error `changed` and nothing removed.
    RemovePlanned { dir: u64, name: &'a [u8], at: P },
    /// [`Resp::Removed`]: every entry removed, in order.
    RemoveEach { dir: u64, name: &'a [u8] },
    /// [`Resp::Ok`].
    Rename {
        from_dir: u64,
        from: &'a [u8],
        to_dir: u64,
        to: &'a [u8],
    },
    /// [`Resp::Ok`].
    Rmdir { dir: u64, name: &'a [u8] },
    /// [`Resp::Bool`].
    MakeWritable { dir: u64 },
    /// [`Resp::Bool`].
    OwnLegacyPartial { dir: u64, name: &'a [u8] },
    /// [`Resp::Info`]: what the server is.
    Info,
    /// The attributes `sel` ([`sel_bits`]) selects of `name` in `dir` (the
    /// directory itself when `None`), of kind `kind`: [`Resp::Xattrs`].
    GetXattrs {
        dir: u64,
        name: Option<&'a [u8]>,
        kind: K,
        sel: u8,
    },
    /// Give `name` in `dir` (the directory when `None`) the attributes
    /// `want` where it has `have` (`None`: just made): [`Resp::Ok`].
    SetXattrs {
        dir: u64,
        name: Option<&'a [u8]>,
        meta: M,
        sel: u8,
        want: Attrs<'a>,
        have: Option<Attrs<'a>>,
    },
    /// Create (with `replace`, atomically replace) fifo or device node
    /// `name` as `meta` says: [`Resp::Ok`].
    Special {
        dir: u64,
        name: &'a [u8],
        meta: M,
        replace: bool,
    },
    /// Make `name` in `dir` another name (a hard link) of `from_name` in
    /// `from_dir`, atomically replacing what has that name: [`Resp::Ok`].
    Link {
        from_dir: u64,
        from_name: &'a [u8],
        dir: u64,
        name: &'a [u8],
    },
    /// Start writing a big file as handle `file` into its resumable
    /// partial, for content `ident` of `meta.size` bytes:
    /// [`Resp::Ranges`], what an earlier run recorded as written (then
    /// [`Req::WriteAt`], [`Req::PartSync`], [`Req::PartRecord`],
    /// [`Req::Commit`] or [`Req::Abort`], which keeps the partial).
    PartOpen {
        dir: u64,
        name: &'a [u8],
        meta: M,
        ident: &'a str,
        file: u64,
    },
    /// Open the partial at `path` (another connection's [`Req::PartOpen`]
    /// made it) as handle `file`, for [`Req::WriteAt`] (no reply).
    PartAttach { path: &'a [u8], file: u64 },
    /// [`Resp::Ok`], or the first error of file `file`'s writes; with
    /// `flush`, once its writes are flushed to disk; with `close`, the
    /// handle is forgotten.
    PartSync { file: u64, flush: bool, close: bool },
    /// Record that `ranges` of partial `file` are written and flushed (no
    /// reply; best effort).
    PartRecord { file: u64, ranges: Vec<(u64, u64)> },
    /// The delta signature of `name` in `dir`, made there, when it is a
    /// regular file of at least `min` bytes: [`Resp::Signature`].
    Sign { dir: u64, name: &'a [u8], min: u64 },
    /// Build file `file` (just created with [`Req::Create`]) from the old
    /// file `old` of `dir`, signed with `block`-byte blocks at `size`
    /// bytes, and the ops of the [`Req::Patch`]es that follow (no reply; a
    /// failure, or a rebuilt file whose hash is not the source's, comes
    /// back on its commit).
    PatchFrom {
        dir: u64,
        file: u64,
        old: &'a [u8],
        block: u32,
        size: u64,
    },
    /// The next ops of file `file`'s rebuild, encoded (no reply).
    Patch {
        file: u64,
        #[serde(with = "serde_bytes")]
        ops: &'a [u8],
    },
    /// Start the ops that turn the file the encoded signature `sig`
    /// describes into open file `file` (read from its start), computed
    /// ahead of the [`Req::DiffRead`]s that fetch them (no reply).
    Diff {
        file: u64,
        #[serde(with = "serde_bytes")]
        sig: &'a [u8],
    },
    /// The `seq`-th batch (from 0) of file `file`'s ops: [`Resp::Ops`].
    DiffRead { file: u64, seq: u64 },
    /// Keep `name` of `dir` (of the tree [`Req::Root`] opened at `root`)
    /// at `path` below the base: `root/base` unless `abs`, else `base`
    /// itself (absolute, or relative to the server's working directory,
    /// the login directory), as `Store::keep` says (`overwrite`,
    /// `replacing`, `planned`): [`Resp::Ok`].
    Keep {
        dir: u64,
        name: &'a [u8],
        root: &'a [u8],
        abs: bool,
        base: &'a [u8],
        path: &'a [u8],
        overwrite: bool,
        replacing: bool,
        planned: Option<P>,
    },
    /// Watch the tree at `path` with inotify, as a local `--watch` does,
    /// until the connection closes: [`Resp::Bool`] once it is watched (or an
    /// error: no inotify there; the bool: whether the tree is there), then any number of [`Resp::Changes`] and
    /// [`Resp::Note`] with the same id. Sent alone on a connection of its
    /// own (a stream that never ends must not hold up a store's requests).
    /// `poll`: milliseconds between retries of directories that got no
    /// watch (the watch limit) or of a missing root.
    Watch { path: &'a [u8], poll: u64 },
    /// Send a heartbeat every `ms` milliseconds until the connection
    /// closes (no reply; the heartbeat is an [`Resp::Ok`] of id 0, which no
    /// request has): the client's I/O timeout (`--timeout`) then gives up
    /// only a server that stopped, not one busy with a long request.
    KeepAlive { ms: u64 },
    /// Start a patch in place of `name` in `dir`, listed as `old`, to
    /// `size` bytes in `block`-byte blocks, as handle `file`
    /// (`ferry_engine::delta::inplace`): the old file's block hashes under
    /// `key`, made there, [`Resp::Blocks`] (`None`: it cannot be patched
    /// in place).
    PatchHash {
        dir: u64,
        name: &'a [u8],
        old: M,
        size: u64,
        block: u64,
        key: [u8; 32],
        file: u64,
    },
    /// The head blocks `changed` differ: the rollback record (with their
    /// old bytes) written and the patch begun (no reply; a failure comes
    /// back on [`Req::PatchCommit`]).
    PatchBegin {
        file: u64,
        changed: Vec<u32>,
        /// The new content's short hashes of the `changed` blocks, in
        /// the same order (kept in the record).
        hashes: Vec<u32>,
    },
    /// Bytes of the patch at `at` (no reply).
    PatchWrite {
        file: u64,
        at: u64,
        #[serde(with = "serde_bytes")]
        data: &'a [u8],
    },
    /// The end of a patch: the root hash checked, metadata set, synced
    /// with `fsync`, the record removed: [`Resp::Ok`], or the error (the
    /// file rolled back).
    PatchCommit {
        file: u64,
        root: [u8; 32],
        meta: M,
        fsync: bool,
    },
    /// Give up patch `file`: rolled back (no reply).
    PatchAbort { file: u64 },
    /// The sender's hashes of open file `file` for a patch in place of a
    /// copy of `old` bytes to its `size` bytes in `block`-byte blocks
    /// under `key`: [`Resp::BlockHashes`].
    PatchHashes {
        file: u64,
        old: u64,
        size: u64,
        block: u64,
        key: [u8; 32],
    },
    /// The client only reads (`ferry ls`, `ferry versions`, a dry run):
    /// rollback records are never acted on nor removed (no reply).
    ReadOnly,
    /// Bytes and inodes free on the filesystem of directory `dir` (for
    /// the message of a full disk): [`Resp::Space`].
    Space { dir: u64 },
    /// What a location there is, and its tree opened when it is one, in
    /// one round trip (resolving SRC or DST, then the run's
    /// [`Req::Root`]): [`Resp::Meta`] of `path` (a final symlink
    /// followed; `None`: missing), and when that is a directory it is
    /// opened as handle `dir` as [`Req::Root`] opens it (its metadata then
    /// the open directory's): [`Resp::Root`]. A directory that cannot be
    /// opened is answered as not opened ([`Req::Root`] then says why).
    StatRoot { path: &'a [u8], dir: u64 },
    /// List the tree at `path` (as `StatRoot` names it) ahead, for the
    /// `List`s this run will send (protocol 15; no reply): sent with the
    /// hello when the run walks that tree.
    ListAhead { path: &'a [u8] },
    /// [`Req::OpenDir`], sent ahead of the walk for a directory it will
    /// likely open (protocol 16): opened in the order the requests come,
    /// so that the next one may name it as its parent, and answered with
    /// the directory's identity ([`Resp::DirOpened`]), which the walk
    /// compares with the one its parent's listing gives before it takes
    /// the handle. Refused while this end holds many open directories
    /// (a quarter of its descriptors): those are the walk's.
    OpenDirAhead {
        dir: u64,
        #[serde(with = "serde_bytes")]
        name: &'a [u8],
        new: u64,
    },
    /// Sent by the client as it reads this end's hello (protocol 17):
    /// answered with [`Resp::Count`], the microseconds from the hello's
    /// write to this request's read, here: the connection's round trip,
    /// measured on one clock and before anything else is queued either
    /// way (a reply's own wait behind the first listings is not in it).
    Ping,
}

impl Req<'_> {
    /// True for a request that changes no file or directory (it reads,
    /// lists, opens or closes handles, or is about the session): one
    /// that is not ends the listing ahead ([`Req::ListAhead`]).
    pub fn changes_nothing(&self) -> bool {
        matches!(
            self,
            Req::Root { create: false, .. }
                | Req::StatPath { .. }
                | Req::Stat { .. }
                | Req::List { .. }
                | Req::OpenDir { .. }
                | Req::Close { .. }
                | Req::Open { .. }
                | Req::OpenPath { .. }
                | Req::Read { .. }
                | Req::ReadLink { .. }
                | Req::Info
                | Req::GetXattrs { .. }
                | Req::Sign { .. }
                | Req::Diff { .. }
                | Req::DiffRead { .. }
                | Req::Watch { .. }
                | Req::KeepAlive { .. }
                | Req::ReadOnly
                | Req::Space { .. }
                | Req::StatRoot { .. }
                | Req::ListAhead { .. }
                | Req::OpenDirAhead { .. }
                | Req::Ping
        )
    }
}

/// An error on the wire: the OS error number when there is one, else the
/// kind and the message.
#[derive(Serialize, Deserialize, Debug)]
pub struct WireErr {
    errno: i32,
    kind: u8,
    msg: String,
}

const KINDS: [io::ErrorKind; 11] = [
    io::ErrorKind::Other,
    io::ErrorKind::NotFound,
    io::ErrorKind::PermissionDenied,
    io::ErrorKind::AlreadyExists,
    io::ErrorKind::InvalidInput,
    io::ErrorKind::InvalidData,
    io::ErrorKind::Unsupported,
    io::ErrorKind::DirectoryNotEmpty,
    io::ErrorKind::UnexpectedEof,
    io::ErrorKind::NotADirectory,
    io::ErrorKind::StorageFull,
];

/// The `kind` of [`ferry_engine::store::changed`]: an act the server did
/// not do because its entry changed since it was listed; the client gets
/// the same error a local check gives (`is_changed`).
const CHANGED: u8 = 0x80;

impl From<&io::Error> for WireErr {
    fn from(e: &io::Error) -> WireErr {
        let kind = match ferry_engine::store::is_changed(e) {
            true => CHANGED,
            false => KINDS.iter().position(|k| *k == e.kind()).unwrap_or(0) as u8,
        };
        WireErr {
            errno: e.raw_os_error().unwrap_or(0),
            kind,
            msg: e.to_string(),
        }
    }
}

impl From<WireErr> for io::Error {
    fn from(w: WireErr) -> io::Error {
        if w.errno != 0 {
            return io::Error::from_raw_os_error(w.errno);
        }
        if w.kind == CHANGED {
            return ferry_engine::store::changed();
        }
        io::Error::new(KINDS[(w.kind as usize).min(KINDS.len() - 1)], w.msg)
    }
}

/// A reply (server to client).
#[allow(missing_docs)]
#[derive(Serialize, Deserialize, Debug)]
pub enum Resp<'a> {
    /// Done.
    Ok,
    /// Failed.
    Err(WireErr),
    /// An entry's metadata, `None` when it does not exist.
    Meta(Option<M>),
    /// A directory's entries, sorted: the names NUL-terminated one after
    /// the other, their metadata in the same order, and the entries that
    /// could not be read.
    Listing {
        #[serde(with = "serde_bytes")]
        names: &'a [u8],
        metas: Vec<M>,
        errors: Vec<(&'a [u8], WireErr)>,
    },
    /// A file opened: its whole content when small (up to one byte past
    /// its size, to show growth), and its size and mtime (after reading a
    /// small one; a big one's, with its inode number, identify the content
    /// its ranges are read from); whether it may have holes (a big one's
    /// reads then send them as [`Resp::Data`]'s `zeros`); the attributes
    /// asked for.
    Opened {
        #[serde(with = "serde_bytes")]
        data: Option<&'a [u8]>,
        current: Option<(u64, i64, u32)>,
        ino: u64,
        sparse: bool,
        xattrs: Attrs<'a>,
    },
    /// Bytes read: `data` with runs of zeros (offset in the range, length)
    /// put in, in order, that did not travel (holes). A short read is the
    /// end of the file, and then `current` holds its size and mtime.
    Data {
        #[serde(with = "serde_bytes")]
        data: &'a [u8],
        current: Option<(u64, i64, u32)>,
        zeros: Vec<(u32, u32)>,
    },
    /// An entry's attributes.
    Xattrs(Attrs<'a>),
    /// A symlink's target.
    Bytes(&'a [u8]),
    /// A yes or no.
    Bool(bool),
    /// A count.
    Count(u64),
    /// Entries removed (path below the removed name, size), the name last.
    Removed(Vec<(Vec<u8>, u64)>),
    /// The server: whether it runs as root (keeps owners), its cores.
    Info { root: bool, cores: u32 },
    /// Byte ranges `[start, end)`.
    Ranges(Vec<(u64, u64)>),
    /// An encoded delta signature; `None`: not a regular file of the size
    /// asked for.
    Signature(#[serde(with = "serde_bytes")] Option<&'a [u8]>),
    /// Encoded delta ops; `end`: the last batch (ending with the end op),
    /// with the file's size and mtime after it was read.
    Ops {
        #[serde(with = "serde_bytes")]
        ops: &'a [u8],
        end: bool,
        current: Option<(u64, i64, u32)>,
    },
    /// What changed in a watched tree ([`Req::Watch`]), read at once.
    Changes(Vec<Event>),
    /// A line for the user about a watched tree (the watch limit reached).
    Note(String),
    /// An old file's head block hashes, truncated and encoded
    /// ([`Req::PatchHash`]); `None`: it cannot be patched in place.
    Blocks(#[serde(with = "serde_bytes")] Option<&'a [u8]>),
    /// A file's head block hashes (truncated, encoded) and the root hash
    /// of all its blocks ([`Req::PatchHashes`]).
    BlockHashes {
        #[serde(with = "serde_bytes")]
        list: &'a [u8],
        root: [u8; 32],
    },
    /// Bytes and inodes free ([`Req::Space`]).
    Space { bytes: u64, inodes: u64 },
    /// The answer to [`Req::StatRoot`]: the metadata (`None`: missing),
    /// and whether the directory was opened as the handle asked.
    Root { meta: Option<M>, opened: bool },
    /// The answer to [`Req::OpenDirAhead`]: the directory opened, its
    /// device and inode (as its parent's listing gives them).
    DirOpened { dev: u64, ino: u64 },
    /// Sent unasked (id 0) right after the hello by a server started with
    /// the tree the client walks (`serve --walk-ahead=PATH`, protocol
    /// 18): it answers, without waiting for them, the first flight's
    /// `StatRoot` (id 1, opened as handle 3) and root `List` (id 2), and
    /// for each of these root's subdirectories (name, handle, id of its
    /// `OpenDirAhead` answer, id of its `List` answer) an open and a
    /// listing, as if the client had asked them. The client's own
    /// requests of ids 1 and 2, which reach it a round trip later, are
    /// then not answered again.
    Pushed(Vec<(Vec<u8>, u64, u64, u64)>),
}

/// A change in a watched tree ([`ferry_engine::watch::Change`] without its side),
/// paths relative to the watched root.
#[allow(missing_docs)]
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Entry(#[serde(with = "serde_bytes")] Vec<u8>, bool),
    Dir(#[serde(with = "serde_bytes")] Vec<u8>),
    Deep(#[serde(with = "serde_bytes")] Vec<u8>),
    Rename(
        #[serde(with = "serde_bytes")] Vec<u8>,
        #[serde(with = "serde_bytes")] Vec<u8>,
        bool,
    ),
    Overflow,
    Gone,
    Back,
    Removed(#[serde(with = "serde_bytes")] Vec<u8>),
}

impl Event {
    /// The event of a change (its side dropped).
    pub fn of(c: ferry_engine::watch::Change) -> Event {
        use ferry_engine::watch::Change as C;
        match c {
            C::Entry(_, p, ready) => Event::Entry(p, ready),
            C::Dir(_, p) => Event::Dir(p),
            C::Deep(_, p) => Event::Deep(p),
            C::Rename(_, f, t, d) => Event::Rename(f, t, d),
            C::Overflow(_) => Event::Overflow,
            C::Gone(_) => Event::Gone,
            C::Back(_) => Event::Back,
            C::Removed(_, p) => Event::Removed(p),
        }
    }

    /// The change of this event on side `side`.
    pub fn change(self, side: usize) -> ferry_engine::watch::Change {
        use ferry_engine::watch::Change as C;
        match self {
            Event::Entry(p, ready) => C::Entry(side, p, ready),
            Event::Dir(p) => C::Dir(side, p),
            Event::Deep(p) => C::Deep(side, p),
            Event::Rename(f, t, d) => C::Rename(side, f, t, d),
            Event::Overflow => C::Overflow(side),
            Event::Gone => C::Gone(side),
            Event::Back => C::Back(side),
            Event::Removed(p) => C::Removed(side, p),
        }
    }
}

/// Encode an `io::Result<()>` as a reply.
pub fn reply_of(r: io::Result<()>) -> Resp<'static> {
    match r {
        Ok(()) => Resp::Ok,
        Err(e) => Resp::Err((&e).into()),
    }
}

#[cfg(test)]
mod tests;
