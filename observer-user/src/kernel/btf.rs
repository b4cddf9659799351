//! Struct offsets from the running kernel's BTF. Rust eBPF has no CO-RE field relocations, so the
//! loader reads them here and hands them to the programs in `CONFIG`.
use std::path::Path;

use btf_rs::{Btf, BtfType, Type};
use observer_common::config::TaskOffsets;

use super::KernelError;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// Parsed kernel BTF.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    pub fn load() -> Result<Self, KernelError> {
        Self::from_file(Path::new(VMLINUX))
    }

    pub fn from_file(path: &Path) -> Result<Self, KernelError> {
        if !path.exists() {
            return Err(KernelError::NoBtf(path.to_path_buf()));
        }
        Btf::from_file(path)
            .map(|btf| Self { btf })
            .map_err(|e| KernelError::Btf(format!("parsing {}: {e}", path.display())))
    }

    /// Byte offset of `field` in `struct name`, looking through anonymous struct and union members
    /// (task_struct keeps many fields in them).
    pub fn member_offset(&self, name: &str, field: &str) -> Result<u32, KernelError> {
        let structs = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| KernelError::Btf(format!("struct {name}: {e}")))?;
        // A name can have several types (a forward declaration, a struct); take the one that has it.
        for ty in structs {
            if let Type::Struct(s) = ty {
                if let Some(bits) = self.find_member(&s, field, 0)? {
                    if bits % 8 != 0 {
                        return Err(KernelError::Btf(format!("{name}.{field} is a bitfield")));
                    }
                    return Ok(bits / 8);
                }
            }
        }
        Err(KernelError::Btf(format!(
            "struct {name} has no member {field}"
        )))
    }

    fn find_member(
        &self,
        s: &btf_rs::Struct,
        field: &str,
        base_bits: u32,
    ) -> Result<Option<u32>, KernelError> {
        for m in &s.members {
            let bits = base_bits + m.bit_offset();
            let name = self.btf.resolve_name(m).unwrap_or_default();
            if name == field {
                return Ok(Some(bits));
            }
            if name.is_empty() {
                if let Ok(Type::Struct(inner) | Type::Union(inner)) =
                    self.btf.resolve_chained_type(m)
                {
                    if let Some(found) = self.find_member(&inner, field, bits)? {
                        return Ok(Some(found));
                    }
                }
            }
        }
        Ok(None)
    }

    /// `sizeof(struct name)`.
    pub fn struct_size(&self, name: &str) -> Result<u32, KernelError> {
        let types = self
            .btf
            .resolve_types_by_name(name)
            .map_err(|e| KernelError::Btf(format!("struct {name}: {e}")))?;
        types
            .into_iter()
            .find_map(|t| match t {
                Type::Struct(s) if s.size() > 0 => Some(s.size() as u32),
                _ => None,
            })
            .ok_or_else(|| KernelError::Btf(format!("struct {name} not found")))
    }

    /// Number of arguments of a BTF-enabled tracepoint, without the leading context pointer.
    pub fn tracepoint_arity(&self, tracepoint: &str) -> Result<usize, KernelError> {
        let typedef = format!("btf_trace_{tracepoint}");
        let ty = self
            .btf
            .resolve_types_by_name(&typedef)
            .map_err(|_| KernelError::TracepointMissing(tracepoint.to_string()))?
            .into_iter()
            .next()
            .ok_or_else(|| KernelError::TracepointMissing(tracepoint.to_string()))?;
        // typedef -> pointer -> function prototype (void *, args...)
        let mut cur = ty;
        for _ in 0..4 {
            cur = match cur {
                Type::FuncProto(p) => return Ok(p.parameters.len().saturating_sub(1)),
                Type::Typedef(t) => self.chain(&t)?,
                Type::Ptr(p) => self.chain(&p)?,
                _ => break,
            };
        }
        Err(KernelError::Btf(format!(
            "{typedef} is not a function pointer"
        )))
    }

    fn chain(&self, t: &dyn BtfType) -> Result<Type, KernelError> {
        self.btf
            .resolve_chained_type(t)
            .map_err(|e| KernelError::Btf(e.to_string()))
    }

    /// Whether the kernel has a function of that name (one fentry programs can attach to).
    pub fn has_function(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .is_ok_and(|types| types.iter().any(|t| matches!(t, Type::Func(_))))
    }

    pub fn task_offsets(&self) -> Result<TaskOffsets, KernelError> {
        Ok(TaskOffsets {
            exit_code: self.member_offset("task_struct", "exit_code")?,
            real_parent: self.member_offset("task_struct", "real_parent")?,
            tgid: self.member_offset("task_struct", "tgid")?,
            signal: self.member_offset("task_struct", "signal")?,
            signal_live: self.member_offset("signal_struct", "live")?,
            bprm_filename: self.member_offset("linux_binprm", "filename")?,
            thread_pid: self.member_offset("task_struct", "thread_pid")?,
            pid_level: self.member_offset("pid", "level")?,
            pid_numbers: self.member_offset("pid", "numbers")?,
            upid_nr: self.member_offset("upid", "nr")?,
            upid_size: self.struct_size("upid")?,
            signal_oom_score_adj: self.member_offset("signal_struct", "oom_score_adj")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn btf() -> Option<KernelBtf> {
        if !Path::new(VMLINUX).exists() {
            eprintln!("skipping: {VMLINUX} absent (kernel without BTF)");
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true requires kernel BTF"
            );
            return None;
        }
        Some(KernelBtf::load().expect("parse vmlinux BTF"))
    }

    #[test]
    fn task_offsets_are_plausible_and_distinct() {
        let Some(btf) = btf() else { return };
        let o = btf.task_offsets().unwrap();
        // task_struct is kilobytes long; every field we use sits well past its first cache line
        // and the fields are distinct.
        let fields = [o.exit_code, o.real_parent, o.tgid, o.signal];
        for f in fields {
            assert!(f > 64 && f < 16384, "{o:?}");
        }
        let mut sorted = fields.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), fields.len());
        // `bpftool btf dump file /sys/kernel/btf/vmlinux` on the 6.18.44 kernel this was first
        // checked on puts exit_code at bit 9312 (a cross-check of the BTF walk, not a constant).
        if std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .is_ok_and(|r| r.starts_with("6.18."))
        {
            assert_eq!(o.exit_code * 8, 9312);
        }
    }

    #[test]
    fn missing_member_is_a_clear_error() {
        let Some(btf) = btf() else { return };
        let err = btf
            .member_offset("task_struct", "no_such_field")
            .unwrap_err();
        assert!(err.to_string().contains("no member no_such_field"), "{err}");
    }

    #[test]
    fn functions_are_found_by_name() {
        let Some(btf) = btf() else { return };
        assert!(btf.has_function("do_exit"));
        assert!(
            !btf.has_function("task_struct"),
            "a struct is not a function"
        );
        assert!(!btf.has_function("no_such_function_observer"));
    }

    #[test]
    fn sched_process_exit_arity() {
        let Some(btf) = btf() else { return };
        let n = btf.tracepoint_arity("sched_process_exit").unwrap();
        assert!(n == 1 || n == 2, "{n}");
        assert_eq!(btf.tracepoint_arity("sched_process_exec").unwrap(), 3);
    }
}
