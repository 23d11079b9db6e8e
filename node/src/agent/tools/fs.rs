//! File tools: `file_read` (a file's text, capped) and `file_write` (a backup of the file it
//! replaces first, then an atomic write), both inside the roots.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

use mesh_domain::{Tier, ToolSpec, time::now_ms};
use serde_json::{Value, json};

use crate::agent::tools::{
    framework::{Tool, ToolContext, ToolError, cap, str_arg},
    roots::Roots,
};

/// Writes a file that must not exist yet: `create_new` (O_CREAT|O_EXCL) fails on anything
/// already there, a symlink included, so a link planted beside the target cannot redirect the
/// write outside the roots.
async fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut file = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await?;
    file.write_all(bytes).await?;
    file.flush().await
}

/// `file_read`: a file's text.
#[derive(Debug)]
pub(crate) struct FileRead {
    pub(crate) roots: Arc<Roots>,
}

impl Tool for FileRead {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "file_read".into(),
            description: "Read a text file (at most 64 KiB are returned).".into(),
            parameters: json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "File path, relative to the workspace"}},
                "required": ["path"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Read
    }

    async fn call(&self, args: &Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        let path = self.roots.resolve(str_arg(args, "path")?)?;
        let bytes = tokio::fs::read(&path)
            .await
            .map_err(ToolError::io("cannot read", &path))?;
        Ok(cap(String::from_utf8_lossy(&bytes).into_owned()))
    }
}

/// `file_write`: writes a file, keeping a backup of the one it replaces.
#[derive(Debug)]
pub(crate) struct FileWrite {
    pub(crate) roots: Arc<Roots>,
}

impl Tool for FileWrite {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "file_write".into(),
            description: "Write a text file; an existing file is kept as <name>.<time>.bak first."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File path, relative to the workspace"},
                    "content": {"type": "string"},
                },
                "required": ["path", "content"],
            }),
        }
    }

    fn tier(&self) -> Tier {
        Tier::Write
    }

    async fn call(&self, args: &Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        let path = self.roots.resolve(str_arg(args, "path")?)?;
        let content = str_arg(args, "content")?;
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(ToolError::io("cannot create", parent))?;
        }
        let mut note = String::new();
        if path.exists() {
            let stamp = now_ms();
            let mut backup = path.clone().into_os_string();
            backup.push(format!(".{stamp}.bak"));
            let backup = PathBuf::from(backup);
            let previous = tokio::fs::read(&path)
                .await
                .map_err(ToolError::io("cannot back up", &path))?;
            write_new(&backup, &previous)
                .await
                .map_err(ToolError::io("cannot back up", &path))?;
            note = format!(" (previous version kept as {})", backup.display());
        }
        // Write beside the target and rename, so a crash never leaves half a file.
        let mut temp = path.clone().into_os_string();
        temp.push(format!(".{}.agentmesh-tmp", uuid::Uuid::now_v7().simple()));
        let temp = PathBuf::from(temp);
        write_new(&temp, content.as_bytes())
            .await
            .map_err(ToolError::io("cannot write", &path))?;
        tokio::fs::rename(&temp, &path)
            .await
            .map_err(ToolError::io("cannot write", &path))?;
        Ok(format!(
            "wrote {} bytes to {}{note}",
            content.len(),
            path.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::tools::{framework::test_support::ctx, roots::test_support::roots};

    #[tokio::test]
    async fn file_write_keeps_a_backup_and_file_read_reads_back() {
        let (_dir, roots) = roots();
        let write = FileWrite {
            roots: roots.clone(),
        };
        let read = FileRead {
            roots: roots.clone(),
        };
        write
            .call(&json!({"path": "a.txt", "content": "one"}), &ctx())
            .await
            .expect("first write");
        let note = write
            .call(&json!({"path": "a.txt", "content": "two"}), &ctx())
            .await
            .expect("second write");
        assert!(note.contains(".bak"), "{note}");
        assert_eq!(
            read.call(&json!({"path": "a.txt"}), &ctx())
                .await
                .expect("read"),
            "two"
        );
        let backups: Vec<_> = std::fs::read_dir(roots.default_dir().expect("dir"))
            .expect("list")
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".bak"))
            .collect();
        assert_eq!(backups.len(), 1);
        assert_eq!(
            std::fs::read_to_string(backups[0].path()).expect("backup"),
            "one"
        );
    }

    #[tokio::test]
    async fn a_symlink_planted_beside_the_target_cannot_redirect_a_write() {
        let (dir, roots) = roots();
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "untouched").expect("outside");
        let ws = roots.default_dir().expect("dir");
        // The names a write used to put beside its target, and a backup-like name.
        for planted in ["a.txt.agentmesh-tmp", "b.txt.agentmesh-tmp"] {
            std::os::unix::fs::symlink(&outside, ws.join(planted)).expect("symlink");
        }
        let write = FileWrite {
            roots: roots.clone(),
        };
        write
            .call(&json!({"path": "a.txt", "content": "new"}), &ctx())
            .await
            .expect("write");
        assert_eq!(
            std::fs::read_to_string(&outside).expect("read"),
            "untouched"
        );
        assert!(
            !std::fs::symlink_metadata(ws.join("a.txt"))
                .expect("a.txt")
                .file_type()
                .is_symlink(),
            "the target is a plain file"
        );
        // write_new itself refuses anything already there, a symlink included.
        let planted = ws.join("b.txt.agentmesh-tmp");
        assert!(write_new(&planted, b"x").await.is_err());
        assert_eq!(
            std::fs::read_to_string(&outside).expect("read"),
            "untouched"
        );
    }
}
