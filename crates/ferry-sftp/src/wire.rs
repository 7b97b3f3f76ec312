//! SFTP version 3 on the wire (draft-ietf-secsh-filexfer-02, as OpenSSH
//! speaks it): packets are `u32 length, u8 type, u32 id, fields`; strings
//! are `u32 length, bytes`. Requests are built in one buffer whose length
//! and id the connection fills in; replies are read in place.

use std::io;

use ferry_engine::entry::{Kind, Meta};

pub const INIT: u8 = 1;
pub const VERSION: u8 = 2;
pub const OPEN: u8 = 3;
pub const CLOSE: u8 = 4;
pub const READ: u8 = 5;
pub const WRITE: u8 = 6;
pub const LSTAT: u8 = 7;
pub const FSTAT: u8 = 8;
pub const SETSTAT: u8 = 9;
pub const FSETSTAT: u8 = 10;
pub const OPENDIR: u8 = 11;
pub const READDIR: u8 = 12;
pub const REMOVE: u8 = 13;
pub const MKDIR: u8 = 14;
pub const RMDIR: u8 = 15;
pub const STAT: u8 = 17;
pub const RENAME: u8 = 18;
pub const READLINK: u8 = 19;
pub const SYMLINK: u8 = 20;
pub const EXTENDED: u8 = 200;

const STATUS: u8 = 101;
const HANDLE: u8 = 102;
const DATA: u8 = 103;
const NAME: u8 = 104;
const ATTRS: u8 = 105;
const EXTENDED_REPLY: u8 = 201;

/// `SSH_FXF_*` open flags.
pub const F_READ: u32 = 1;
pub const F_WRITE: u32 = 2;
pub const F_CREAT: u32 = 8;
pub const F_TRUNC: u32 = 0x10;
pub const F_EXCL: u32 = 0x20;

const A_SIZE: u32 = 1;
const A_UIDGID: u32 = 2;
const A_PERM: u32 = 4;
const A_TIME: u32 = 8;
const A_EXT: u32 = 0x8000_0000;

const FX_EOF: u32 = 1;
const FX_NO_SUCH_FILE: u32 = 2;
const FX_PERMISSION_DENIED: u32 = 3;
/// `SSH_FX_FAILURE`: SFTP version 3's catch-all (OpenSSH's sftp-server
/// says it for a full disk, among others).
pub const FX_FAILURE: u32 = 4;
const FX_OP_UNSUPPORTED: u32 = 8;

/// A request being built: length and id are filled in when it is sent.
pub struct Req(pub Vec<u8>);

impl Req {
    /// A request of type `t`.
    pub fn new(t: u8) -> Req {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&[0, 0, 0, 0, t, 0, 0, 0, 0]);
        Req(b)
    }

    /// `t` with a path as its first field.
    pub fn path(t: u8, p: &[u8]) -> Req {
        Req::new(t).str(p)
    }

    /// An `SSH_FXP_EXTENDED` request named `name`.
    pub fn ext(name: &str) -> Req {
        Req::new(EXTENDED).str(name.as_bytes())
    }

    pub fn u32(mut self, v: u32) -> Req {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn u64(mut self, v: u64) -> Req {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub fn str(mut self, s: &[u8]) -> Req {
        self.0.extend_from_slice(&(s.len() as u32).to_be_bytes());
        self.0.extend_from_slice(s);
        self
    }

    /// Attributes: the mode and/or the times of `set`.
    pub fn attrs(self, set: &Set) -> Req {
        let mut flags = 0;
        if set.mode.is_some() {
            flags |= A_PERM;
        }
        if set.mtime.is_some() {
            flags |= A_TIME;
        }
        if set.owner.is_some() {
            flags |= A_UIDGID;
        }
        let mut r = self.u32(flags);
        if let Some((u, g)) = set.owner {
            r = r.u32(u).u32(g);
        }
        if let Some(m) = set.mode {
            r = r.u32(m);
        }
        if let Some(t) = set.mtime {
            // The access time too: SFTP sets both or neither.
            r = r.u32(t).u32(t);
        }
        r
    }

    /// The packet with `id`, ready to send.
    pub fn finish(mut self, id: u32) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_be_bytes());
        self.0[5..9].copy_from_slice(&id.to_be_bytes());
        self.0
    }
}

/// Attributes to set.
#[derive(Clone, Copy, Debug, Default)]
pub struct Set {
    pub mode: Option<u32>,
    /// Seconds (SFTP v3 keeps 32-bit seconds, no fraction).
    pub mtime: Option<u32>,
    pub owner: Option<(u32, u32)>,
}

/// Names of a directory read, with their attributes.
pub type Names<'a> = Vec<(&'a [u8], Attrs)>;

/// A reply: the packet after its length (type, id, fields).
pub struct Reply {
    pub t: u8,
    pub body: Vec<u8>,
}

/// A cursor over a reply's fields.
pub struct Rd<'a>(pub &'a [u8]);

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "SFTP: short packet")
}

impl<'a> Rd<'a> {
    pub fn u32(&mut self) -> io::Result<u32> {
        let (h, t) = self.0.split_at_checked(4).ok_or_else(short)?;
        self.0 = t;
        Ok(u32::from_be_bytes(h.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> io::Result<u64> {
        Ok((u64::from(self.u32()?) << 32) | u64::from(self.u32()?))
    }

    pub fn str(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        let (h, t) = self.0.split_at_checked(n).ok_or_else(short)?;
        self.0 = t;
        Ok(h)
    }

    pub fn attrs(&mut self) -> io::Result<Attrs> {
        let flags = self.u32()?;
        let mut a = Attrs::default();
        if flags & A_SIZE != 0 {
            a.size = Some(self.u64()?);
        }
        if flags & A_UIDGID != 0 {
            a.owner = (self.u32()?, self.u32()?);
        }
        if flags & A_PERM != 0 {
            a.perm = Some(self.u32()?);
        }
        if flags & A_TIME != 0 {
            let _atime = self.u32()?;
            a.mtime = self.u32()?;
        }
        if flags & A_EXT != 0 {
            for _ in 0..self.u32()? {
                self.str()?;
                self.str()?;
            }
        }
        Ok(a)
    }
}

/// Attributes as read.
#[derive(Clone, Copy, Debug, Default)]
pub struct Attrs {
    pub size: Option<u64>,
    pub owner: (u32, u32),
    pub perm: Option<u32>,
    pub mtime: u32,
}

impl Attrs {
    /// As ferry's metadata (no inode, no nanoseconds: SFTP has neither).
    pub fn meta(&self) -> Meta {
        let perm = self.perm.unwrap_or(0);
        let kind = match perm & 0o170000 {
            0o100000 => Kind::File,
            0o040000 => Kind::Dir,
            0o120000 => Kind::Symlink,
            0o010000 => Kind::Fifo,
            0o020000 => Kind::CharDev,
            0o060000 => Kind::BlockDev,
            0o140000 => Kind::Socket,
            // A server that sends no type bits: a file.
            0 => Kind::File,
            _ => Kind::Other,
        };
        Meta {
            kind,
            size: self.size.unwrap_or(0),
            mtime_sec: i64::from(self.mtime),
            mtime_nsec: 0,
            mode: perm & 0o7777,
            uid: self.owner.0,
            gid: self.owner.1,
            ino: 0,
            version: 0,
            rdev: 0,
            sparse: false,
            nlink: 0,
            dev: 0,
            ctime: 0,
        }
    }
}

/// A failed request: an `SSH_FXP_STATUS` other than OK, as an error.
fn status_error(code: u32, msg: &[u8]) -> io::Error {
    let kind = match code {
        FX_NO_SUCH_FILE => io::ErrorKind::NotFound,
        FX_PERMISSION_DENIED => io::ErrorKind::PermissionDenied,
        FX_OP_UNSUPPORTED => io::ErrorKind::Unsupported,
        FX_EOF => io::ErrorKind::UnexpectedEof,
        _ => io::ErrorKind::Other,
    };
    let msg = String::from_utf8_lossy(msg);
    if msg.is_empty() {
        io::Error::from(kind)
    } else {
        io::Error::new(
            kind,
            Status {
                code,
                msg: msg.into_owned(),
            },
        )
    }
}

/// A server's status other than OK, with its message: `SFTP server: MSG`.
#[derive(Debug)]
pub struct Status {
    /// `SSH_FX_*`.
    pub code: u32,
    pub msg: String,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SFTP server: {}", self.msg)
    }
}

impl std::error::Error for Status {}

/// The `SSH_FX_*` code of a failed request's error, when it is one.
pub fn status_code(e: &io::Error) -> Option<u32> {
    e.get_ref()?.downcast_ref::<Status>().map(|s| s.code)
}

fn unexpected(t: u8) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("SFTP: unexpected reply type {t}"),
    )
}

impl Reply {
    fn rd(&self) -> Rd<'_> {
        Rd(self.body.get(5..).unwrap_or_default())
    }

    /// A status reply: `Ok(true)` for OK, `Ok(false)` for EOF.
    fn status(&self) -> io::Result<bool> {
        if self.t != STATUS {
            return Err(unexpected(self.t));
        }
        let mut r = self.rd();
        let code = r.u32()?;
        match code {
            0 => Ok(true),
            FX_EOF => Ok(false),
            _ => Err(status_error(code, r.str().unwrap_or_default())),
        }
    }

    /// The reply of a request that answers with a status.
    pub fn ok(&self) -> io::Result<()> {
        match self.status()? {
            true => Ok(()),
            false => Err(status_error(FX_EOF, b"")),
        }
    }

    /// A handle.
    pub fn handle(&self) -> io::Result<Vec<u8>> {
        match self.t {
            HANDLE => Ok(self.rd().str()?.to_vec()),
            _ => Err(self.status().err().unwrap_or_else(|| unexpected(self.t))),
        }
    }

    /// Attributes.
    pub fn attrs(&self) -> io::Result<Attrs> {
        match self.t {
            ATTRS => self.rd().attrs(),
            _ => Err(self.status().err().unwrap_or_else(|| unexpected(self.t))),
        }
    }

    /// Attributes, `None` when there is no such entry.
    pub fn attrs_if(&self) -> io::Result<Option<Attrs>> {
        match self.attrs() {
            Ok(a) => Ok(Some(a)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The data of a read (where it is in `body`), `None` at end of file.
    pub fn data(&self) -> io::Result<Option<(usize, usize)>> {
        match self.t {
            DATA => {
                let n = self.rd().str()?.len();
                Ok(Some((9, 9 + n)))
            }
            _ => match self.status()? {
                false => Ok(None),
                true => Err(unexpected(self.t)),
            },
        }
    }

    /// The names of a directory read (name, attributes), `None` at its end.
    pub fn names(&self) -> io::Result<Option<Names<'_>>> {
        if self.t != NAME {
            return match self.status()? {
                false => Ok(None),
                true => Err(unexpected(self.t)),
            };
        }
        let mut r = self.rd();
        let n = r.u32()?;
        let mut v = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let name = r.str()?;
            r.str()?; // the `ls -l` line
            v.push((name, r.attrs()?));
        }
        Ok(Some(v))
    }

    /// The one name of a `READLINK` reply.
    pub fn name(&self) -> io::Result<Vec<u8>> {
        match self.names()? {
            Some(v) if !v.is_empty() => Ok(v[0].0.to_vec()),
            _ => Err(unexpected(self.t)),
        }
    }

    /// The fields of an `SSH_FXP_EXTENDED_REPLY`.
    pub fn extended(&self) -> io::Result<Rd<'_>> {
        match self.t {
            EXTENDED_REPLY => Ok(self.rd()),
            _ => Err(self.status().err().unwrap_or_else(|| unexpected(self.t))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_framed_and_replies_read() {
        let p = Req::path(OPEN, b"a/b")
            .u32(F_READ)
            .attrs(&Set {
                mode: Some(0o600),
                mtime: Some(7),
                owner: None,
            })
            .finish(9);
        assert_eq!(
            u32::from_be_bytes(p[..4].try_into().unwrap()) as usize,
            p.len() - 4
        );
        assert_eq!((p[4], &p[5..9]), (OPEN, &[0, 0, 0, 9][..]));
        let mut r = Rd(&p[9..]);
        assert_eq!(r.str().unwrap(), b"a/b");
        assert_eq!(r.u32().unwrap(), F_READ);
        let a = r.attrs().unwrap();
        assert_eq!((a.perm, a.mtime, a.size), (Some(0o600), 7, None));
        assert!(r.0.is_empty());

        let st = |code: u32| Reply {
            t: STATUS,
            body: [
                &[STATUS, 0, 0, 0, 1][..],
                &code.to_be_bytes(),
                &[0, 0, 0, 2],
                b"no",
                &[0, 0, 0, 0],
            ]
            .concat(),
        };
        assert!(st(0).ok().is_ok());
        assert_eq!(st(2).ok().unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(
            st(3).ok().unwrap_err().kind(),
            io::ErrorKind::PermissionDenied
        );
        assert!(st(2).attrs_if().unwrap().is_none());
        assert!(st(1).data().unwrap().is_none() && st(1).names().unwrap().is_none());
        assert!(Reply {
            t: STATUS,
            body: vec![STATUS, 0, 0]
        }
        .ok()
        .is_err());
        let d = Reply {
            t: DATA,
            body: [&[DATA, 0, 0, 0, 1, 0, 0, 0, 3][..], b"abc"].concat(),
        };
        let (a, b) = d.data().unwrap().unwrap();
        assert_eq!(&d.body[a..b], b"abc");
        let a = Attrs {
            size: Some(3),
            owner: (1, 2),
            perm: Some(0o120777),
            mtime: 5,
        }
        .meta();
        assert_eq!(
            (a.kind, a.mode, a.size, a.mtime_sec),
            (Kind::Symlink, 0o777, 3, 5)
        );
    }
}
