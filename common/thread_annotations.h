// Clang thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html): lock
// rules the compiler checks under -Wthread-safety (scripts/clang_tsa.sh). They expand to nothing
// on other compilers. Use them with carpool::Mutex (common/mutex.h): std::mutex is not annotated.
#ifndef CARPOOL_COMMON_THREAD_ANNOTATIONS_H_
#define CARPOOL_COMMON_THREAD_ANNOTATIONS_H_

#if defined(__clang__)
#define CARPOOL_THREAD_ANNOTATION_(x) __attribute__((x))
#else
#define CARPOOL_THREAD_ANNOTATION_(x)
#endif

// A type that is a capability (a lock), e.g. CAPABILITY("mutex").
#define CAPABILITY(name) CARPOOL_THREAD_ANNOTATION_(capability(name))
// An RAII type that holds a capability from its construction to its destruction.
#define SCOPED_CAPABILITY CARPOOL_THREAD_ANNOTATION_(scoped_lockable)

// A member read or written only with the capability held.
#define GUARDED_BY(x) CARPOOL_THREAD_ANNOTATION_(guarded_by(x))
// A pointer member whose pointee is read or written only with the capability held.
#define PT_GUARDED_BY(x) CARPOOL_THREAD_ANNOTATION_(pt_guarded_by(x))

// The declared order between two capabilities of one object: this one is taken after (before)
// the ones named, never the other way round (checked under -Wthread-safety-beta).
#define ACQUIRED_AFTER(...) CARPOOL_THREAD_ANNOTATION_(acquired_after(__VA_ARGS__))
#define ACQUIRED_BEFORE(...) CARPOOL_THREAD_ANNOTATION_(acquired_before(__VA_ARGS__))

// A function callers must call with the capabilities held (exclusively, or at least shared).
#define REQUIRES(...) CARPOOL_THREAD_ANNOTATION_(requires_capability(__VA_ARGS__))
#define REQUIRES_SHARED(...) CARPOOL_THREAD_ANNOTATION_(requires_shared_capability(__VA_ARGS__))
// A function callers must not call with the capabilities held (it takes them itself).
#define EXCLUDES(...) CARPOOL_THREAD_ANNOTATION_(locks_excluded(__VA_ARGS__))

// A function that takes, gives back or tries to take the capabilities (its object if none named).
#define ACQUIRE(...) CARPOOL_THREAD_ANNOTATION_(acquire_capability(__VA_ARGS__))
#define RELEASE(...) CARPOOL_THREAD_ANNOTATION_(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) CARPOOL_THREAD_ANNOTATION_(try_acquire_capability(__VA_ARGS__))
// A function that checks at run time that the capability is held; afterwards the analysis
// assumes it is.
#define ASSERT_CAPABILITY(x) CARPOOL_THREAD_ANNOTATION_(assert_capability(x))
// A function returning a reference to the capability named.
#define RETURN_CAPABILITY(x) CARPOOL_THREAD_ANNOTATION_(lock_returned(x))

// Turns the analysis off for one function; every use says why on the line above.
#define NO_THREAD_SAFETY_ANALYSIS CARPOOL_THREAD_ANNOTATION_(no_thread_safety_analysis)

#endif  // CARPOOL_COMMON_THREAD_ANNOTATIONS_H_
