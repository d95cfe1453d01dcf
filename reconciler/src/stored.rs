//! Owns the mapping between the review store's enums and the text stored in
//! its columns: [`stored_enum!`] gives an enum its stored name (`as_str`),
//! `FromStr`, `Display`, JSON (`findings --json`) and SQLite conversions, so
//! every state is a type and each name is written once.

use std::fmt;

/// A stored name that no variant has (a review file written by a newer
/// build, or edited by hand).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// The enum's name.
    pub what: &'static str,
    /// The text read.
    pub name: String,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}", self.what, self.name)
    }
}

impl std::error::Error for UnknownName {}

/// Declares an enum whose variants are stored as the given names:
/// `stored_enum! { /// doc
/// pub enum E { /// doc
/// A => "a", } }`.
macro_rules! stored_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $v:ident => $s:literal,)+ }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v,)+ }

        impl $name {
            /// Every variant, in declaration order (not every enum needs it
            /// outside the tests).
            #[allow(dead_code)]
            pub const ALL: &'static [$name] = &[$($name::$v),+];

            /// The name as stored.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$v => $s,)+ }
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::stored::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($s => Ok($name::$v),)+
                    _ => Err($crate::stored::UnknownName { what: stringify!($name), name: s.to_string() }),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl rusqlite::types::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(self.as_str().into())
            }
        }

        impl rusqlite::types::FromSql for $name {
            fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
                v.as_str()?.parse().map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }
    };
}
pub(crate) use stored_enum;
