// UnityEngineStub.cs: the members of UnityEngine that Samples~/NpcDialogue/NpcDialogue.cs uses, with
// their signatures, so that the sample is type-checked here where Unity is not installed (build.sh
// --tests). Nothing of it runs.
using System;

namespace UnityEngine
{
    public class Object { }
    public class Component : Object { }
    public class Behaviour : Component { }
    public class MonoBehaviour : Behaviour { }

    [AttributeUsage(AttributeTargets.Field)]
    public sealed class SerializeField : Attribute { }

    public static class Application
    {
        public static string streamingAssetsPath { get { return ""; } }
        public static string persistentDataPath { get { return ""; } }
    }

    public static class Debug
    {
        public static void Log(object message) { }
        public static void LogError(object message) { }
    }
}
